// The limit dialog, for admins: create a limit, or edit one. What the form
// shows and sends follows the sort of limit (format.js sortOf), which is
// fixed once the limit exists: the stored state of a rate limit's buckets,
// a quota's usage and a concurrency limit's leases mean nothing to another
// sort, so the API refuses the change (409) and the form does not offer it.

import {
  $, busy, clearErrors, clearProblem, focusProblem, h, openDialog, reportProblem, showFieldErrors, showProblem, showSort,
} from './dom.js';
import { allowance, paramsOf, period, sortOf } from './format.js';
import { readParams, sayDuration, watchDuration } from './input.js';

const dialog = $('#limit-dialog');
const form = $('#limit-form');
const formProblem = $('#lf-problem');
const notice = $('#limits-notice');

// app is what the rest of the page lends this dialog: the session (its
// client and limits) and reloadLimits().
let app;
// editing is the limit the dialog edits, as the API gave it when the
// dialog opened; null while it creates one.
let editing = null;
// saving ignores a second submit while the first is on its way.
let saving = false;

function limitPath(name) {
  return `v1/limits/${encodeURIComponent(name)}`;
}

// init wires the dialog once, and offers the browser's time zones (UTC
// first, the API's default) as suggestions; the API checks what is typed.
export function init(context) {
  app = context;
  const zones = ['UTC', ...Intl.supportedValuesOf('timeZone').filter((z) => z !== 'UTC')];
  $('#lf-zones').replaceChildren(...zones.map((z) => h('option', { value: z })));
  form.addEventListener('submit', onSave);
  form.elements.kind.addEventListener('change', syncSort);
  watchDuration(form.elements.period);
  for (const type of ['input', 'change']) form.addEventListener(type, showRestart);
}

// openCreate opens the dialog for a new limit.
export function openCreate() {
  editing = null;
  fillForm(null);
  openDialog(dialog);
}

// openEdit opens the dialog on the limit as it is now, which may differ
// from the row that was clicked.
export async function openEdit(name) {
  const problem = $('#limits-problem');
  clearProblem(problem);
  let limit;
  try {
    ({ data: limit } = await app.session.client.call('GET', limitPath(name)));
  } catch (err) {
    showProblem(problem, err);
    focusProblem(problem);
    if (err.status === 404) app.reloadLimits();
    return;
  }
  editing = limit;
  fillForm(limit);
  openDialog(dialog, { returnFocus: () => editButton(name) });
}

// editButton finds a row's edit button again after the table was
// re-rendered, to give the focus back to it.
function editButton(name) {
  return $(`#limits-table tr[data-limit="${CSS.escape(name)}"] [data-act="edit-limit"]`) ?? $('#limits-title');
}

const fixedKind = {
  rate: 'a rate limit',
  quota: 'a calendar quota (kind rate, with a calendar)',
  concurrency: 'a concurrency limit',
};

function fillForm(l) {
  const f = form.elements;
  clearErrors(form);
  clearProblem(formProblem);
  $('#lf-title').textContent = l ? `Edit limit ${l.name}` : 'New limit';
  f.name.value = l?.name ?? '';
  f.name.disabled = Boolean(l);
  f.kind.value = sortOf(l);
  f.kind.disabled = Boolean(l);
  $('#lf-kind-hint').textContent = l
    ? `Fixed: ${l.name} is ${fixedKind[sortOf(l)]}, and what its buckets have stored means nothing to another kind. For another kind, create another limit.`
    : 'Fixed once the limit is created.';
  f.id_format.value = l?.id_format ?? '';
  f.calendar.value = l?.calendar ?? 'day';
  f.time_zone.value = l?.time_zone ?? 'UTC';
  f.burst.value = l?.burst ?? '';
  f.count.value = l?.count ?? '';
  f.period.value = l?.period ? period(l.period) : '';
  sayDuration(f.period);
  f.unit.value = l?.unit ?? 'requests';
  f.description.value = l?.description ?? '';
  f.shadow.checked = l?.shadow ?? false;
  syncSort();
}

// syncSort shows the fields of the chosen sort, and disables the others,
// so that they are neither sent nor focused.
function syncSort() {
  const f = form.elements;
  const sort = f.kind.value;
  showSort(form, sort);
  for (const key of ['burst', 'count', 'period']) f[key].disabled = !paramsOf[sort].includes(key);
  f.calendar.disabled = f.time_zone.disabled = sort !== 'quota';
  showRestart();
}

// restarts reports whether saving the form gives the quota being edited
// new windows: the API then starts its usage again, every bucket full.
function restarts() {
  const f = form.elements;
  return sortOf(editing) === 'quota' &&
    (f.calendar.value !== editing.calendar || (f.time_zone.value.trim() || 'UTC') !== editing.time_zone);
}

// showRestart says before saving what a new calendar or zone costs.
function showRestart() {
  $('#lf-restart').textContent = restarts()
    ? `A new window or time zone starts the quota's usage again: once saved, every bucket of ${editing.name} is full, whatever it used in this ${editing.calendar}.`
    : '';
}

// bodyOf is the PUT body: the whole limit, since a PUT replaces it. Only
// the fields of the chosen sort are sent; empty fields are left out, and
// the API says which are required. It returns the errors of what the page
// could not read instead, so that nothing half-read is sent.
function bodyOf() {
  const f = form.elements;
  const sort = f.kind.value;
  const { values, errors } = readParams(form, paramsOf[sort]);
  if (errors.length > 0) return { errors };
  const body = {
    kind: sort === 'concurrency' ? 'concurrency' : 'rate',
    description: f.description.value,
    shadow: f.shadow.checked,
  };
  if (f.id_format.value !== '') body.id_format = f.id_format.value;
  if (sort === 'quota') {
    body.calendar = f.calendar.value;
    const zone = f.time_zone.value.trim();
    if (zone !== '') body.time_zone = zone;
  }
  Object.assign(body, values);
  const unit = f.unit.value.trim();
  if (unit !== '') body.unit = unit;
  return { body };
}

async function onSave(ev) {
  ev.preventDefault();
  if (saving) return;
  saving = true;
  clearErrors(form);
  clearProblem(formProblem);
  try {
    await save();
  } finally {
    saving = false;
  }
}

async function save() {
  const name = editing?.name ?? form.elements.name.value.trim();
  // A PUT to an existing name replaces that limit: a new limit must not
  // take the name of one the page lists.
  if (!editing) {
    const taken = name === '' ? 'Enter a name.'
      : app.session.limits.some((l) => l.name === name) ? 'A limit of this name exists: edit it in the list instead.' : '';
    if (taken) {
      showFieldErrors(form, [{ field: 'name', message: taken }]);
      return;
    }
  }
  const { body, errors } = bodyOf();
  if (errors) {
    showFieldErrors(form, errors);
    return;
  }
  const restart = restarts();
  let data;
  try {
    ({ data } = await busy(dialog, () => app.session.client.call('PUT', limitPath(name), { body })));
  } catch (err) {
    reportProblem(form, formProblem, err);
    return;
  }
  // The table is drawn anew before the dialog closes, so that the focus
  // goes back to the new row's button.
  await app.reloadLimits();
  dialog.close();
  notice.textContent = `${editing ? 'Saved' : 'Created'} the limit ${data.name}: ${allowance(data, data)}.` +
    (restart ? ' Its usage starts again in the new windows.' : '');
}
