// The admin page of ratelimitd: sign-in with a pasted token, the limits,
// Envoy's rules, and the look-up of a bucket, by limit and bucket id or by
// Envoy domain and descriptor. The limit dialog is in limits.js, the
// overrides panel in overrides.js. The page uses only the public REST API
// (api.js).

import { Client, describe } from './api.js';
import {
  $, breakable, busy, clearErrors, clearProblem, fill, focusProblem, fromTemplate, h, initDialogs, leftOutKey, notInForce,
  reportProblem, showFieldErrors, showProblem, showSort,
} from './dom.js';
import {
  allowance, counted, duration, kindName, localTime, sortOf, unitFor, utcTime,
} from './format.js';
import * as limits from './limits.js';
import * as overrides from './overrides.js';
import * as tryRequest from './tryrequest.js';

// The token lives in sessionStorage: it survives a reload of the tab and
// is gone when the tab closes. It is never put in a URL or a cookie.
const TOKEN_KEY = 'ratelimitd.admin.token';

// session is what the page knows after sign-in. leftOut holds the reason
// of each stored row this replica left out of force (GET /v1/status), by
// leftOutKey.
const session = { client: null, me: null, limits: [], rules: [], leftOut: new Map() };

// Whether a scope may change overrides, as the API documents it; every
// scope may look buckets up. Only admins change limits.
const mayManage = (scope) => scope === 'admin' || scope === 'support';
const mayDefine = (scope) => scope === 'admin';

// ---- sign-in ----

async function signIn(token) {
  const form = $('#token-form');
  clearErrors(form);
  const client = new Client(token, () => {
    // Only a token that was accepted before signs the user out.
    if (session.client === client) signOut('The token is no longer accepted: it is unknown or was revoked. Paste a valid one.');
  });
  let me;
  try {
    ({ data: me } = await busy(form, () => client.call('GET', 'v1/whoami')));
  } catch (err) {
    if (err.status === 401) sessionStorage.removeItem(TOKEN_KEY);
    const d = describe(err);
    const message = err.status === 401 ? 'This token is not accepted: it is unknown or was revoked.' : `${d.heading}: ${d.detail} ${d.hint}`;
    showFieldErrors(form, [{ field: 'token', message }]);
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  Object.assign(session, { client, me });
  form.reset();

  $('#who-name').textContent = me.name;
  $('#who-scope').textContent = me.scope;
  $('#session').hidden = false;
  $('#sign-in').hidden = true;
  $('#app').hidden = false;

  const manage = mayManage(me.scope);
  $('#overrides-panel').hidden = !manage;
  $('#lookup-panel').hidden = false;
  const note = $('#scope-note');
  note.hidden = manage;
  note.textContent = manage ? '' : `A ${me.scope} token can read the limits and look up buckets, but not change overrides. Sign in with a support token for that.`;
  $('#main').focus();

  await loadLimits();
  if (manage) overrides.start();
}

function signOut(message = '') {
  sessionStorage.removeItem(TOKEN_KEY);
  Object.assign(session, { client: null, me: null, limits: [], rules: [], leftOut: new Map() });
  for (const dialog of document.querySelectorAll('dialog[open]')) dialog.close();
  overrides.stop();
  tryRequest.clear();
  clearLookup();
  $('#lookup-form').reset();
  showLookupBy('bucket');
  $('#limits-table tbody').replaceChildren();
  $('#limits-notice').textContent = '';
  $('#left-out').hidden = true;
  $('#rules-table tbody').replaceChildren();
  $('#app').hidden = true;
  $('#session').hidden = true;
  $('#sign-in').hidden = false;
  const form = $('#token-form');
  clearErrors(form);
  if (message) showFieldErrors(form, [{ field: 'token', message }]);
  $('#token').focus();
}

// ---- limits ----

async function loadLimits() {
  const problem = $('#limits-problem');
  try {
    const [{ data }, { data: status }] = await busy($('#limits-panel'), () => Promise.all([
      session.client.call('GET', 'v1/limits'), session.client.call('GET', 'v1/status')]));
    session.limits = data.limits;
    session.leftOut = new Map(status.snapshot.left_out.map((r) => [leftOutKey(r.entity, r.id), r.reason]));
    renderLeftOut(status.snapshot.left_out);
    clearProblem(problem);
  } catch (err) {
    showProblem(problem, err);
    return;
  }
  renderLimits();
  fillLimitSelects();
  await loadRules();
}

// renderLeftOut lists the rows left out, those no table shows included
// (the overrides of a limit, until searched).
function renderLeftOut(rows) {
  $('#left-out-list').replaceChildren(...rows.map((r) => h('li', {},
    `${r.entity} `, h('code', {}, r.id), r.limit ? ` of ${r.limit}` : '', `: ${r.reason}`)));
  $('#left-out').hidden = rows.length === 0;
}

// ---- Envoy rules ----

// descriptorText writes a rule's pattern as people read it: an entry
// without a value takes any.
const descriptorText = (entries) => entries.map((e) => `${e.key}=${e.value ?? '(any)'}`).join(', ');

async function loadRules() {
  const problem = $('#rules-problem');
  let rules;
  try {
    ({ data: { rules } } = await busy($('#rules-panel'), () => session.client.call('GET', 'v1/rules')));
    clearProblem(problem);
  } catch (err) {
    showProblem(problem, err);
    return;
  }
  const rows = rules.map((r) => {
    const row = fromTemplate('rule-row');
    row.dataset.rule = r.id;
    fill(row, 'domain', ...breakable(r.domain));
    fill(row, 'descriptor', ...breakable(descriptorText(r.descriptor)));
    fill(row, 'limit', ...breakable(r.limit));
    fill(row, 'left-out', notInForce(session.leftOut, 'rule', r.id) ?? '');
    return row;
  });
  session.rules = rules;
  $('#rules-table tbody').replaceChildren(...rows);
  $('#rules-empty').hidden = rows.length > 0;
}

// parseDescriptor reads "key=value, key=value" into entries; a part
// without "=" is an entry with an empty value, which the API refuses with
// its own message.
const parseDescriptor = (text) => text.split(',').map((part) => part.trim()).filter((part) => part !== '').map((part) => {
  const at = part.indexOf('=');
  return at < 0 ? { key: part, value: '' } : { key: part.slice(0, at).trim(), value: part.slice(at + 1).trim() };
});

// showLookupBy shows the fields of one way to name a bucket.
function showLookupBy(by) {
  $('#lk-by-bucket').hidden = by !== 'bucket';
  $('#lk-by-descriptor').hidden = by !== 'descriptor';
}

function renderLimits() {
  const manage = mayManage(session.me.scope);
  const define = mayDefine(session.me.scope);
  $('#new-limit').hidden = !define;
  $('#limits-change-head').hidden = !define;
  const rows = session.limits.map((l) => {
    const row = fromTemplate('limit-row');
    row.dataset.limit = l.name;
    fill(row, 'name', ...breakable(l.name));
    fill(row, 'description', l.description);
    fill(row, 'kind', kindName(l));
    fill(row, 'id-format', l.id_format);
    fill(row, 'defaults', allowance(l, l));
    fill(row, 'shadow', l.shadow ? 'Yes: never denies' : 'No');
    fill(row, 'what', ` limit ${l.name}`);
    fill(row, 'left-out', notInForce(session.leftOut, 'limit', l.name) ?? '');
    row.querySelector('[data-slot="change"]').hidden = !define;
    const n = l.override_count;
    fill(row, 'overrides', manage
      ? h('button', { type: 'button', class: 'link', 'data-limit': l.name },
        String(n), h('span', { class: 'vh' }, ` ${n === 1 ? 'override' : 'overrides'} of ${l.name}: show`))
      : String(n));
    return row;
  });
  $('#limits-table tbody').replaceChildren(...rows);
  $('#limits-empty').hidden = rows.length > 0;
}

// fillLimitSelects lists the limits in every limit <select>, keeping what
// each had selected.
function fillLimitSelects() {
  for (const select of document.querySelectorAll('select.limit-select')) {
    const keep = select.value;
    select.replaceChildren(
      h('option', { value: '' }, select.dataset.any ?? 'Choose a limit'),
      ...session.limits.map((l) => h('option', { value: l.name }, l.name)),
    );
    select.value = session.limits.some((l) => l.name === keep) ? keep : '';
  }
}

function showOverridesOf(name) {
  const form = $('#search-form');
  form.reset();
  form.elements.limit.value = name;
  form.requestSubmit();
  $('#overrides-title').focus();
}

// ---- look up a bucket ----

// lastLookup is the bucket shown, canonical, for "reset" and "again".
let lastLookup = null;
let lookupSeq = 0;

function clearLookup() {
  lookupSeq++;
  lastLookup = null;
  $('#lookup-result').hidden = true;
  clearProblem($('#lookup-problem'));
  $('#lookup-notice').textContent = '';
}

// lookUp checks the bucket with cost 0, which spends nothing, and shows
// what is left of it. Without arguments it reads the form.
// A descriptor is matched first (POST v1/rules/match), then its bucket
// checked like any other.
async function lookUp(limit, bucketID) {
  const form = $('#lookup-form');
  const byDescriptor = limit === undefined && form.elements.by.value === 'descriptor';
  let target = {
    limit: limit ?? form.elements.limit.value,
    bucket_id: bucketID ?? form.elements.bucket_id.value.trim(),
  };
  const seq = ++lookupSeq;
  clearErrors(form);
  clearProblem($('#lookup-problem'));
  let rule = null;
  try {
    if (byDescriptor) {
      const { data } = await busy($('#lookup-panel'), () => session.client.call('POST', 'v1/rules/match', {
        body: { domain: form.elements.domain.value.trim(), descriptor: parseDescriptor(form.elements.descriptor.value) },
      }));
      rule = data.rule;
      target = { limit: data.limit, bucket_id: data.bucket_id };
    }
    const { result, definition } = await busy($('#lookup-panel'), async () => {
      const { data } = await session.client.call('POST', 'v1/check', { body: { buckets: [{ ...target, cost: 0 }] } });
      // The decision does not say what sort of limit it is of, nor a
      // quota's calendar: the limit, read now, does.
      const name = encodeURIComponent(data.decisions[0].limit);
      return { result: data, definition: (await session.client.call('GET', `v1/limits/${name}`)).data };
    });
    if (seq !== lookupSeq) return;
    showDecision(result, definition, rule);
  } catch (err) {
    if (seq !== lookupSeq) return;
    lastLookup = null;
    $('#lookup-result').hidden = true;
    $('#lookup-notice').textContent = '';
    // The API names the fields of a decision "buckets[0].bucket_id", and
    // those of a descriptor "descriptor[1].value".
    const toName = (field) => field.replace(/^buckets\[0\]\./, '').replace(/^descriptor\[.*$/, 'descriptor');
    reportProblem(form, $('#lookup-problem'), err, { toName });
  }
}

const sources = {
  default: "The limit's default",
  override: 'An override',
  unlimited: 'An unlimited override: always allowed',
};

// capacity is what the remaining tokens are out of, for each sort.
const capacity = {
  rate: (d) => `${d.burst} (its burst)`,
  quota: (d) => `${d.count} (its count)`,
  concurrency: (d) => `${d.burst} (at most at once)`,
};

// showDecision shows a check of a bucket of limit: what is left, and what
// is held (a concurrency limit's leases) or used (a quota's window).
function showDecision(result, limit, rule = null) {
  const d = result.decisions[0];
  const sort = sortOf(limit);
  showSort($('#lookup-result'), sort);
  const matched = $('#lk-rule');
  matched.hidden = rule === null;
  matched.textContent = rule ? `Envoy rule of domain ${rule.domain}: ${descriptorText(rule.descriptor)}` : '';
  lastLookup = { limit: d.limit, bucket_id: d.bucket_id };
  $('#lk-canonical').textContent = d.bucket_id;
  $('#lk-limit-name').textContent = d.limit;
  const exempt = d.source === 'unlimited';
  const notCounted = 'Not counted: an unlimited override exempts the bucket';
  $('#lk-held').textContent = exempt ? notCounted : `${d.held} of ${d.burst} held`;
  // A quota's debt (after a settle) is usage beyond its count.
  const used = d.count - d.remaining + d.debt;
  const thisWindow = sort === 'quota' ? `this ${limit.calendar} (${limit.time_zone})` : '';
  $('#lk-used').textContent = exempt ? notCounted
    : `Used ${used} of ${d.count} ${thisWindow}, resets in ${duration(d.reset_after_ms)}`;
  $('#lk-remaining').textContent = String(d.remaining);
  $('#lk-unit').textContent = unitFor(d.remaining, d.unit);
  // A settle that charged more than was left puts a bucket into debt;
  // spends are denied until the refill, or a quota's next window, has
  // paid it off.
  $('#lk-debt').textContent = d.debt > 0
    ? `${counted(d.debt, d.unit)} owed: spends are denied until ${sort === 'quota' ? 'the window ends' : 'it is paid off'}`
    : 'None';
  $('#lk-burst').textContent = capacity[sort](d);
  const full = $('#lk-reset-at');
  if (d.reset_after_ms <= 0) {
    full.textContent = sort === 'concurrency' ? 'Now: no lease is held' : 'Now: the bucket is full';
  } else {
    const at = new Date(Date.now() + d.reset_after_ms);
    full.textContent = `In ${duration(d.reset_after_ms)}, at ${localTime(at)} (${utcTime(at)})`;
  }
  $('#lk-params').textContent = exempt ? 'None: the bucket is exempt' : allowance(d, limit);
  $('#lk-source').textContent = sources[d.source] ?? d.source;
  const warning = $('#lk-warning');
  warning.textContent = result.degraded
    ? 'The store did not answer, so these numbers say nothing about the bucket: ratelimitd is failing open.'
    : d.shadow ? 'This limit is in shadow mode: it is counted but never denies.' : '';
  warning.hidden = warning.textContent === '';
  const scope = session.me.scope;
  $('#lk-reset').hidden = !mayManage(scope);
  $('#lk-grant').hidden = !mayManage(scope) || d.source !== 'default';
  $('#lookup-result').hidden = false;
  let state = `${counted(d.remaining, d.unit)} of ${d.burst} remaining`;
  if (!exempt && sort === 'concurrency') state = `${d.held} of ${d.burst} held, ${counted(d.remaining, d.unit)} remaining`;
  if (!exempt && sort === 'quota') state = `used ${used} of ${d.count} ${thisWindow}, ${counted(d.remaining, d.unit)} remaining`;
  $('#lookup-notice').textContent = `${d.limit} ${d.bucket_id}: ${state}` + (d.debt > 0 ? `, ${d.debt} owed.` : '.');
}

async function resetBucket() {
  if (!lastLookup) return;
  const target = lastLookup;
  try {
    await busy($('#lookup-panel'), () => session.client.call('POST', 'v1/buckets/reset', { body: { buckets: [target] } }));
  } catch (err) {
    showProblem($('#lookup-problem'), err);
    focusProblem($('#lookup-problem'));
    return;
  }
  await lookUp(target.limit, target.bucket_id);
  $('#lookup-notice').textContent = `Reset ${target.limit} ${target.bucket_id}: the bucket is full again.`;
}

// lookUpFromCard shows a bucket of an override in the look-up panel and
// takes the focus there.
async function lookUpFromCard(limit, bucketID) {
  const form = $('#lookup-form');
  form.elements.limit.value = limit;
  form.elements.bucket_id.value = bucketID;
  await lookUp(limit, bucketID);
  const result = $('#lookup-result');
  (result.hidden ? form.elements.bucket_id : result).focus();
}

// ---- wiring ----

function init() {
  initDialogs();
  limits.init({ session, reloadLimits: loadLimits });
  overrides.init({ session, lookUp: lookUpFromCard, reloadLimits: loadLimits });
  tryRequest.init({ session, rules: () => session.rules });

  $('#token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const token = $('#token').value.trim();
    if (token === '') {
      clearErrors(ev.target);
      showFieldErrors(ev.target, [{ field: 'token', message: 'Paste a token first.' }]);
      return;
    }
    signIn(token);
  });
  $('#sign-out').addEventListener('click', () => signOut());
  $('#limits-reload').addEventListener('click', loadLimits);
  $('#new-limit').addEventListener('click', () => limits.openCreate());
  $('#limits-table').addEventListener('click', (ev) => {
    const button = ev.target.closest('button[data-limit]');
    if (button) showOverridesOf(button.dataset.limit);
    if (ev.target.closest('button[data-act="edit-limit"]')) limits.openEdit(ev.target.closest('tr').dataset.limit);
  });
  $('#lookup-form').addEventListener('change', (ev) => {
    if (ev.target.name === 'by') showLookupBy(ev.target.value);
  });
  $('#lookup-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    lookUp();
  });
  $('#lk-refresh').addEventListener('click', () => lastLookup && lookUp(lastLookup.limit, lastLookup.bucket_id));
  $('#lk-reset').addEventListener('click', resetBucket);
  $('#lk-grant').addEventListener('click', () => lastLookup && overrides.openCreate(lastLookup));

  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) signIn(token);
  else $('#token').focus();
}

init();
