// The "try a forward-auth request" box: the URL a gateway calls and the
// headers it sends are read by the service exactly as a call would be
// (POST v1/forward-auth/{domain}/match), and the answer shows, for each d,
// the descriptor made and the rule, limit and bucket it would spend.
// Nothing is spent.

import { $, breakable, busy, clearErrors, clearProblem, fill, fromTemplate, reportProblem, showFieldErrors } from './dom.js';

const form = $('#try-form');
const problem = $('#try-problem');
const result = $('#try-result');

// app is what the rest of the page lends the box: the session, its client
// and the rules it loaded.
let app;

export function init(context) {
  app = context;
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    tryRequest();
  });
}

// clear hides what an earlier try showed, as at sign-out.
export function clear() {
  result.hidden = true;
  $('#try-table tbody').replaceChildren();
  clearProblem(problem);
  clearErrors(form);
  form.reset();
}

const prefix = '/v1/forward-auth/';

// readURL splits the URL into the domain, as written in the path, and the
// query string; null when it is no forward-auth URL.
function readURL(text) {
  let url;
  try {
    url = new URL(text, 'http://gateway.invalid');
  } catch {
    return null;
  }
  const domain = url.pathname.startsWith(prefix) ? url.pathname.slice(prefix.length) : '';
  if (domain === '' || domain.includes('/')) return null;
  return { domain, query: url.search.replace(/^\?/, '') };
}

// readHeaders reads "Name: value" lines; blank lines are skipped. It
// returns the headers, or the number of the first line without a colon.
function readHeaders(text) {
  const headers = [];
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    if (lines[i].trim() === '') continue;
    const at = lines[i].indexOf(':');
    if (at <= 0) return { bad: i + 1 };
    headers.push({ name: lines[i].slice(0, at).trim(), value: lines[i].slice(at + 1).trim() });
  }
  return { headers };
}

async function tryRequest() {
  clearErrors(form);
  clearProblem(problem);
  const call = readURL(form.elements.url.value.trim());
  const read = readHeaders(form.elements.headers.value);
  const errors = [];
  if (!call) errors.push({ field: 'url', message: `Paste a URL of the form ${prefix}{domain}?d=...` });
  if (read.bad) errors.push({ field: 'headers', message: `Line ${read.bad} is not "Name: value".` });
  if (errors.length) {
    showFieldErrors(form, errors);
    return;
  }
  const body = { query: call.query, headers: read.headers };
  const peer = form.elements.peer.value.trim();
  if (peer !== '') body.peer = peer;
  let data;
  try {
    ({ data } = await busy($('#try-panel'), () => app.session.client.call('POST', `v1/forward-auth/${call.domain}/match`, { body })));
  } catch (err) {
    result.hidden = true;
    // The service names the query's parameters (d[0]) and the headers
    // (X-Forwarded-Uri), which this form holds in two fields.
    const toName = (field) => (/^(d|d\[\d+\]|deny_status|domain|query)$/.test(field) ? 'url' : /^(peer)$/.test(field) ? 'peer' : 'headers');
    reportProblem(form, problem, err, { toName });
    return;
  }
  show(data);
}

function show(data) {
  $('#try-client').textContent = data.client_address === null
    ? 'No descriptor reads the client address.'
    : `Client address: ${data.client_address}`;
  const rules = new Map((app.rules() ?? []).map((r) => [r.id, r]));
  const rows = data.descriptors.map((d) => {
    const row = fromTemplate('try-row');
    row.dataset.d = d.d;
    fill(row, 'd', d.d);
    fill(row, 'descriptor', ...breakable(d.made ? d.entries.map((e) => `${e.key}=${e.value}`).join(', ') : `none: ${d.skipped}`));
    const m = d.match;
    const rule = m && rules.get(m.rule_id);
    const ruleText = !d.made ? '' : !m ? 'no rule: allowed, nothing spent'
      : `${rule ? rule.descriptor.map((e) => `${e.key}=${e.value ?? '(any)'}`).join(', ') : m.rule_id}${m.replaced ? ' (replaced: spends nothing)' : ''}`;
    fill(row, 'rule', ...breakable(ruleText));
    fill(row, 'limit', ...breakable(m ? m.limit : ''));
    fill(row, 'bucket', ...breakable(m ? `${m.bucket_id}${m.source === 'default' ? '' : ` (${m.source})`}` : ''));
    return row;
  });
  $('#try-table tbody').replaceChildren(...rows);
  result.hidden = false;
  result.focus();
}
