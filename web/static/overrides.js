// The overrides panel: search with pages, one card per override, the
// create and edit dialog, enable/disable, delete with confirmation and the
// history of each override. An override sets the parameters of its
// limit's sort: a quota's count, a concurrency limit's burst and lease
// period, a rate limit's all three.

import {
  $, breakable, busy, clearErrors, clearProblem, fill, focusProblem, fromTemplate, h, notInForce, openDialog,
  reportProblem, showFieldErrors, showProblem, showSort,
} from './dom.js';
import {
  allowance, changes, fromLocalInput, localTime, paramsOf, period, relative, sortOf, toLocalInput, utcTime, when,
} from './format.js';
import { parseDuration, readParams, sayDuration, watchDuration } from './input.js';

const PAGE_SIZE = 25;
const MERGE_PATCH = 'application/merge-patch+json';

const panel = $('#overrides-panel');
const list = $('#override-list');
const searchForm = $('#search-form');
const problemBox = $('#overrides-problem');
const notice = $('#overrides-notice');
const dialog = $('#override-dialog');
const form = $('#override-form');
const formProblem = $('#of-problem');
const deleteDialog = $('#delete-dialog');
const historyDialog = $('#history-dialog');

// app is what the rest of the page lends this panel: the session (its
// client and limits), lookUp(limit, bucketID) and reloadLimits().
let app;
// query is the search in force; nextPage continues it.
let query = {};
let nextPage = '';
// searchSeq drops the answer of a search that a newer one replaced.
let searchSeq = 0;
// editing is {override, etag} while the dialog edits one, null while it
// creates one; deleting is the override the delete dialog asks about.
let editing = null;
let deleting = null;
// saving ignores a second submit while the first is on its way.
let saving = false;

function client() {
  return app.session.client;
}

function path(id, rest = '') {
  return `v1/overrides/${encodeURIComponent(id)}${rest}`;
}

// init wires the panel once; start shows the first page after sign-in.
export function init(context) {
  app = context;
  searchForm.addEventListener('submit', (ev) => {
    ev.preventDefault();
    search();
  });
  $('#search-clear').addEventListener('click', () => {
    searchForm.reset();
    search();
  });
  $('#more').addEventListener('click', () => search({ more: true }));
  $('#new-override').addEventListener('click', () => openCreate());
  list.addEventListener('click', onCardAction);

  form.addEventListener('submit', onSave);
  form.elements.limit.addEventListener('change', () => {
    syncParams();
    prefillDefaults();
    showDefaults();
  });
  form.elements.unlimited.addEventListener('change', syncParams);
  watchDuration(form.elements.period);
  for (const type of ['input', 'change']) form.elements.expires_at.addEventListener(type, showExpiry);
  for (const button of form.querySelectorAll('[data-expire-days]')) {
    button.addEventListener('click', () => setExpiry(Number(button.dataset.expireDays)));
  }
  $('#del-confirm').addEventListener('click', onDelete);
  // "Expires in ..." goes stale while the page stays open.
  setInterval(refreshRelativeTimes, 30_000);
}

export function start() {
  search();
}

// stop forgets everything shown, at sign-out.
export function stop() {
  searchSeq++;
  query = {};
  nextPage = '';
  searchForm.reset();
  clearErrors(searchForm);
  clearProblem(problemBox);
  list.replaceChildren();
  notice.textContent = '';
  $('#override-summary').textContent = '';
  $('#more').hidden = true;
}

// ---- search and pages ----

async function search({ more = false } = {}) {
  if (!more) {
    const f = searchForm.elements;
    query = { limit: f.limit.value, bucket_id: f.bucket_id.value.trim(), q: f.q.value.trim(), enabled: f.enabled.value };
    nextPage = '';
  }
  const seq = ++searchSeq;
  clearErrors(searchForm);
  clearProblem(problemBox);
  try {
    const { data } = await busy(panel, () => client().call('GET', 'v1/overrides', {
      query: { ...query, page_size: PAGE_SIZE, page_token: more ? nextPage : '' },
    }));
    if (seq !== searchSeq) return;
    const cards = data.overrides.map(card);
    if (more) {
      list.append(...cards);
      // Keyboard users go on from the first new card.
      cards[0]?.querySelector('.card-title').focus();
    } else {
      list.replaceChildren(...cards);
    }
    nextPage = data.next_page_token;
    $('#more').hidden = !nextPage;
    summarise();
  } catch (err) {
    if (seq !== searchSeq) return;
    reportProblem(searchForm, problemBox, err);
  }
}

// summarise says what the list shows, in a live region.
function summarise() {
  const parts = [];
  if (query.limit) parts.push(`of ${query.limit}`);
  if (query.bucket_id) parts.push(`for bucket id “${query.bucket_id}”`);
  if (query.q) parts.push(`containing “${query.q}”`);
  if (query.enabled) parts.push(query.enabled === 'true' ? 'enabled only' : 'disabled only');
  const filters = parts.length > 0 ? ` ${parts.join(', ')}` : '';
  const n = list.children.length;
  $('#override-summary').textContent = n === 0
    ? `No overrides${filters}.`
    : `Showing ${n} ${n === 1 ? 'override' : 'overrides'}${filters}${nextPage ? '; more below' : ''}.`;
}

// ---- cards ----

function expiryPhrase(at) {
  const date = new Date(at);
  return date > Date.now() ? `Expires ${relative(date)}` : `Expired ${relative(date)}`;
}

function refreshRelativeTimes() {
  for (const el of document.querySelectorAll('[data-expires]')) el.textContent = expiryPhrase(el.dataset.expires);
}

function badge(text, kind) {
  return h('span', { class: `badge ${kind}` }, text);
}

function card(o) {
  const li = fromTemplate('override-card');
  const expired = o.expires_at && new Date(o.expires_at) <= Date.now();
  li.override = o;
  li.dataset.id = o.id;
  li.dataset.limit = o.limit;
  li.dataset.bucket = o.bucket_id;
  li.classList.toggle('inactive', !o.enabled || Boolean(expired));
  fill(li, 'limit', ...breakable(o.limit));
  fill(li, 'bucket', o.bucket_id);
  fill(li, 'what', ` override of ${o.limit} for ${o.bucket_id}`);

  const badges = [o.enabled ? badge('Enabled', 'on') : badge('Disabled', 'off')];
  if (o.unlimited) badges.push(badge('Unlimited', 'info'));
  else if (o.burst === 0) badges.push(badge('Blocked', 'warn'));
  if (o.expires_at) {
    badges.push(h('span', { class: `badge ${expired ? 'off' : 'info'}`, 'data-expires': o.expires_at }, expiryPhrase(o.expires_at)));
  }
  const leftOut = notInForce(app.session.leftOut, 'override', o.id);
  if (leftOut) badges.push(leftOut);
  fill(li, 'badges', ...badges.flatMap((b) => [b, ' ']));
  fill(li, 'allowance', allowance(o, limitNamed(o.limit)));
  fill(li, 'expires', ...(o.expires_at ? [when(o.expires_at)] : ['Never']));
  fill(li, 'comment', o.comment || '(none)');
  fill(li, 'changed', when(o.updated_at), ` by ${o.updated_by}, version ${o.version}`);
  const toggle = li.querySelector('[data-act="toggle"]');
  toggle.replaceChildren(o.enabled ? 'Disable' : 'Enable', h('span', { class: 'vh' }, ` override of ${o.limit} for ${o.bucket_id}`));
  return li;
}

function findCard(id) {
  return list.querySelector(`li[data-id="${CSS.escape(id)}"]`);
}

// cardButton finds a card's button again after the card was re-rendered,
// to give the focus back to it.
function cardButton(id, act) {
  return findCard(id)?.querySelector(`[data-act="${act}"]`) ?? $('#overrides-title');
}

function replaceCard(o) {
  const old = findCard(o.id);
  if (!old) return;
  const hadFocus = old.contains(document.activeElement) && document.activeElement.dataset.act;
  old.replaceWith(card(o));
  if (hadFocus) cardButton(o.id, hadFocus).focus();
}

function removeCard(id) {
  findCard(id)?.remove();
  summarise();
}

async function getOverride(id) {
  const { data, etag } = await client().call('GET', path(id));
  return { override: data, etag };
}

// reloadCard shows an override as it is now, after someone else changed
// or deleted it.
async function reloadCard(id) {
  try {
    replaceCard((await getOverride(id)).override);
  } catch (err) {
    if (err.status === 404) removeCard(id);
  }
}

function onCardAction(ev) {
  const button = ev.target.closest('button[data-act]');
  if (!button) return;
  const o = button.closest('li').override;
  switch (button.dataset.act) {
    case 'edit': openEdit(o); break;
    case 'toggle': toggle(o); break;
    case 'history': openHistory(o); break;
    case 'check': app.lookUp(o.limit, o.bucket_id); break;
    case 'delete': openDelete(o); break;
  }
}

async function toggle(o) {
  clearProblem(problemBox);
  const enabled = !o.enabled;
  try {
    const { data } = await busy(findCard(o.id), () => client().call('PATCH', path(o.id), {
      body: { enabled }, ifMatch: `"${o.version}"`, contentType: MERGE_PATCH,
    }));
    replaceCard(data);
    notice.textContent = `${enabled ? 'Enabled' : 'Disabled'} the override of ${o.limit} for ${o.bucket_id}.`;
  } catch (err) {
    if (err.status === 412 || err.status === 404) await reloadCard(o.id);
    const hint = err.status === 412 ? 'It was changed by someone else since it was shown, and has been reloaded; nothing was changed. Check it and try again.' : undefined;
    showProblem(problemBox, err, { hint });
    focusProblem(problemBox);
  }
}

// ---- the create and edit dialog ----

function limitNamed(name) {
  return app.session.limits.find((l) => l.name === name);
}

// chosenSort is the sort of the limit chosen in the dialog.
function chosenSort() {
  return sortOf(limitNamed(form.elements.limit.value));
}

// openCreate opens the dialog for a new override, with the limit and
// bucket id given (from the look-up panel) or those of the search.
export function openCreate(prefill = {}) {
  editing = null;
  fillForm(null, {
    limit: prefill.limit ?? searchForm.elements.limit.value,
    bucket_id: prefill.bucket_id ?? searchForm.elements.bucket_id.value.trim(),
  });
  openDialog(dialog);
}

async function openEdit(o) {
  clearProblem(problemBox);
  let current;
  try {
    current = await getOverride(o.id);
  } catch (err) {
    if (err.status === 404) removeCard(o.id);
    showProblem(problemBox, err);
    focusProblem(problemBox);
    return;
  }
  replaceCard(current.override);
  editing = current;
  fillForm(current.override);
  const f = form.elements;
  const firstParam = [f.burst, f.count, f.period].find((input) => !input.disabled);
  openDialog(dialog, { focusEl: firstParam ?? f.unlimited, returnFocus: () => cardButton(o.id, 'edit') });
}

function fillForm(o, prefill = {}) {
  const f = form.elements;
  clearErrors(form);
  clearProblem(formProblem);
  $('#of-title').textContent = o ? `Edit override for ${o.bucket_id}` : 'New override';
  f.limit.value = o?.limit ?? prefill.limit ?? '';
  f.bucket_id.value = o?.bucket_id ?? prefill.bucket_id ?? '';
  // A limit and a bucket id are what an override is; they never change.
  f.limit.disabled = f.bucket_id.disabled = Boolean(o);
  f.unlimited.checked = o?.unlimited ?? false;
  f.burst.value = o?.burst ?? '';
  f.count.value = o?.count ?? '';
  f.period.value = o?.period ? period(o.period) : '';
  for (const input of [f.burst, f.count, f.period]) delete input.dataset.prefilled;
  sayDuration(f.period);
  f.comment.value = o?.comment ?? '';
  f.enabled.checked = o?.enabled ?? true;
  f.expires_at.value = toLocalInput(o?.expires_at);
  // The picker offers no past times; the API refuses them anyway.
  f.expires_at.min = toLocalInput(new Date().toISOString());
  syncParams();
  if (!o) prefillDefaults();
  showDefaults();
  showExpiry();
}

// prefillDefaults starts a new override from its limit's defaults, without
// overwriting what the user typed.
function prefillDefaults() {
  if (editing) return;
  const l = limitNamed(form.elements.limit.value);
  for (const key of paramsOf[sortOf(l)]) {
    const input = form.elements[key];
    if (input.value !== '' && input.value !== input.dataset.prefilled) continue;
    const value = !l ? '' : key === 'period' ? period(l.period) : String(l[key]);
    input.value = value;
    input.dataset.prefilled = value;
  }
  sayDuration(form.elements.period);
}

function showDefaults() {
  const l = limitNamed(form.elements.limit.value);
  $('#of-defaults').textContent = l
    ? `The default of ${l.name} is ${allowance(l, l)}.`
    : 'Choose a limit to see its defaults.';
}

// syncParams shows the parameters of the chosen limit's sort, and
// enables those unless the override is unlimited, which keeps none.
function syncParams() {
  const f = form.elements;
  const sort = chosenSort();
  showSort(form, sort);
  for (const key of ['burst', 'count', 'period']) f[key].disabled = f.unlimited.checked || !paramsOf[sort].includes(key);
}

function showExpiry() {
  const input = form.elements.expires_at;
  const date = fromLocalInput(input.value);
  let text;
  if (input.validity.badInput) text = 'Enter a complete date and time, or choose “Never”.';
  else if (!date) text = 'Never expires.';
  else if (date <= Date.now()) text = `That is ${relative(date)}: choose a time in the future.`;
  else text = `Expires ${relative(date)}: ${localTime(date)}, which is ${utcTime(date)}.`;
  $('#of-expires-hint').textContent = text;
}

// setExpiry sets the expiry days from now, or clears it for 0.
function setExpiry(days) {
  const input = form.elements.expires_at;
  input.value = days === 0 ? '' : toLocalInput(new Date(Date.now() + days * 86400e3).toISOString());
  showExpiry();
}

async function onSave(ev) {
  ev.preventDefault();
  if (saving) return;
  saving = true;
  clearErrors(form);
  clearProblem(formProblem);
  try {
    if (form.elements.expires_at.validity.badInput) {
      showFieldErrors(form, [{ field: 'expires_at', message: 'Enter a complete date and time, or choose “Never”.' }]);
      return;
    }
    await (editing ? saveEdit() : saveCreate());
  } finally {
    saving = false;
  }
}

function expiresValue() {
  const date = fromLocalInput(form.elements.expires_at.value);
  return date ? date.toISOString() : null;
}

async function saveCreate() {
  const f = form.elements;
  const body = { limit: f.limit.value, bucket_id: f.bucket_id.value.trim(), comment: f.comment.value, enabled: f.enabled.checked };
  if (f.unlimited.checked) {
    body.unlimited = true;
  } else {
    // Empty fields are left out, and the API says which are required.
    const { values, errors } = readParams(form, paramsOf[chosenSort()]);
    if (errors.length > 0) {
      showFieldErrors(form, errors);
      return;
    }
    Object.assign(body, values);
  }
  const expires = expiresValue();
  if (expires) body.expires_at = expires;
  try {
    const { data } = await busy(dialog, () => client().call('POST', 'v1/overrides', { body }));
    dialog.close();
    notice.textContent = `Created the override of ${data.limit} for ${data.bucket_id}: ${allowance(data, limitNamed(data.limit))}.`;
    await search();
    app.reloadLimits();
  } catch (err) {
    let extra;
    if (err.status === 409) {
      extra = h('button', { type: 'button' }, 'Show the existing override');
      extra.addEventListener('click', () => {
        dialog.close();
        searchForm.reset();
        searchForm.elements.limit.value = body.limit;
        searchForm.elements.bucket_id.value = body.bucket_id;
        search();
      });
    }
    reportProblem(form, formProblem, err, { extra });
  }
}

// patchOf is what the user changed in the form, and only that: a PATCH
// that names a field sets it, and the history shows what changed. It
// returns the errors of what the page could not read instead.
function patchOf(o) {
  const f = form.elements;
  const patch = {};
  const unlimited = f.unlimited.checked;
  if (unlimited !== o.unlimited) patch.unlimited = unlimited;
  if (!unlimited) {
    // Ending an unlimited override needs the parameters of its limit's
    // sort anew. An emptied field is left out, as in a create, and the
    // API says which are required.
    const { values, errors } = readParams(form, paramsOf[chosenSort()]);
    if (errors.length > 0) return { errors };
    for (const [key, value] of Object.entries(values)) {
      const same = key === 'period' ? parseDuration(value).ns === parseDuration(o.period ?? '').ns : value === o[key];
      if (o.unlimited || !same) patch[key] = value;
    }
  }
  if (f.comment.value !== o.comment) patch.comment = f.comment.value;
  if (f.enabled.checked !== o.enabled) patch.enabled = f.enabled.checked;
  if (f.expires_at.value !== toLocalInput(o.expires_at)) patch.expires_at = expiresValue();
  return { patch };
}

async function saveEdit() {
  const o = editing.override;
  const { patch, errors } = patchOf(o);
  if (errors) {
    showFieldErrors(form, errors);
    return;
  }
  if (Object.keys(patch).length === 0) {
    formProblem.replaceChildren(h('p', { class: 'problem-title' }, 'Nothing to save'), h('p', {}, 'No field was changed.'));
    formProblem.hidden = false;
    focusProblem(formProblem);
    return;
  }
  try {
    const { data } = await busy(dialog, () => client().call('PATCH', path(o.id), {
      body: patch, ifMatch: editing.etag, contentType: MERGE_PATCH,
    }));
    dialog.close();
    replaceCard(data);
    notice.textContent = `Saved the override of ${data.limit} for ${data.bucket_id}.`;
  } catch (err) {
    if (err.status === 412) {
      await reloadForm(o.id, err);
    } else if (err.status === 404) {
      showProblem(problemBox, err, { hint: 'It was deleted by someone else.' });
      // Closing the dialog gives the focus back later, in its close
      // event: to the problem, since the card is gone.
      problemBox.tabIndex = -1;
      dialog.returnFocus = () => problemBox;
      dialog.close();
      removeCard(o.id);
    } else {
      reportProblem(form, formProblem, err);
    }
  }
}

// reloadForm puts the override as it is now into the dialog after a 412,
// so that the user sees the other change before making theirs again.
async function reloadForm(id, err) {
  try {
    editing = await getOverride(id);
  } catch (reloadErr) {
    showProblem(formProblem, reloadErr);
    focusProblem(formProblem);
    return;
  }
  fillForm(editing.override);
  replaceCard(editing.override);
  showProblem(formProblem, err, {
    hint: 'This override was changed by someone else since you opened it; it has been reloaded with their values. Nothing of yours was saved: make your change again and save.',
  });
  focusProblem(formProblem);
}

// ---- delete ----

function openDelete(o) {
  deleting = o;
  clearProblem($('#del-problem'));
  $('#del-text').textContent = `The override of ${o.limit} for bucket ${o.bucket_id} (${allowance(o, limitNamed(o.limit))}) will be deleted, and the bucket goes back to the limit's defaults. Its history is kept.`;
  openDialog(deleteDialog, { focusEl: $('#del-cancel'), returnFocus: () => cardButton(o.id, 'delete') });
}

async function onDelete() {
  const o = deleting;
  if (!o) return;
  try {
    await busy(deleteDialog, () => client().call('DELETE', path(o.id)));
  } catch (err) {
    if (err.status !== 404) {
      showProblem($('#del-problem'), err);
      focusProblem($('#del-problem'));
      return;
    }
  }
  deleting = null;
  deleteDialog.close();
  removeCard(o.id);
  notice.textContent = `Deleted the override of ${o.limit} for ${o.bucket_id}.`;
  app.reloadLimits();
}

// ---- history ----

const actions = { create: 'Created', update: 'Changed', delete: 'Deleted' };

function historyEntry(e) {
  const li = fromTemplate('history-entry');
  li.dataset.action = e.action;
  fill(li, 'action', actions[e.action] ?? e.action);
  fill(li, 'actor', e.actor);
  fill(li, 'at', when(e.at));
  const rows = changes(e.before, e.after).map((c) =>
    h('tr', {}, h('th', { scope: 'row' }, c.label), h('td', {}, c.before), h('td', {}, c.after)));
  if (rows.length === 0) rows.push(h('tr', {}, h('td', { colspan: '3' }, 'No visible change.')));
  li.querySelector('tbody').replaceChildren(...rows);
  return li;
}

async function openHistory(o) {
  clearProblem(problemBox);
  let data;
  try {
    ({ data } = await client().call('GET', path(o.id, '/history')));
  } catch (err) {
    showProblem(problemBox, err);
    focusProblem(problemBox);
    return;
  }
  $('#hist-title').textContent = `History of the override for ${o.bucket_id}`;
  $('#hist-subtitle').textContent = `${o.limit}: every change, oldest first.`;
  $('#history-list').replaceChildren(...data.entries.map(historyEntry));
  openDialog(historyDialog, { focusEl: historyDialog.querySelector('[data-close]'), returnFocus: () => cardButton(o.id, 'history') });
}
