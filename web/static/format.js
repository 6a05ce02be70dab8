// How the page writes times, durations and override parameters. Times are
// shown in the user's local time with the UTC value beside them, since the
// API, the logs and the customer may each think in another zone.

import { goToWords } from './input.js';

const localFormat = new Intl.DateTimeFormat(undefined, {
  year: 'numeric', month: 'short', day: 'numeric',
  hour: '2-digit', minute: '2-digit', timeZoneName: 'short',
});
const relativeFormat = new Intl.RelativeTimeFormat(undefined, { numeric: 'always' });

// localTime is a date in the user's time zone, with the zone's name.
export function localTime(date) {
  return localFormat.format(date);
}

// utcTime is a date in UTC to the minute: "2030-01-02 15:04 UTC".
export function utcTime(date) {
  return `${date.toISOString().slice(0, 16).replace('T', ' ')} UTC`;
}

// when is a <time> element in local time followed by the UTC value.
export function when(iso) {
  const date = new Date(iso);
  const time = document.createElement('time');
  time.dateTime = date.toISOString();
  time.textContent = localTime(date);
  const utc = document.createElement('span');
  utc.className = 'utc';
  utc.textContent = ` (${utcTime(date)})`;
  const out = document.createDocumentFragment();
  out.append(time, utc);
  return out;
}

const units = [['day', 86400e3], ['hour', 3600e3], ['minute', 60e3], ['second', 1e3]];

// relative says how far date is from now: "in 7 days", "3 hours ago". A
// unit is used from two of it on, so that 36 hours stay 36 hours.
export function relative(date, now = Date.now()) {
  const ms = date - now;
  for (const [unit, size] of units) {
    if (Math.abs(ms) >= 2 * size || unit === 'second') {
      return relativeFormat.format(Math.round(ms / size), unit);
    }
  }
  return '';
}

// duration writes milliseconds for people, rounded up to the second and
// to at most two units: "2 h 10 min", "45 s".
export function duration(ms) {
  if (ms <= 0) return 'now';
  const total = Math.ceil(ms / 1000);
  const parts = [
    [Math.floor(total / 86400), 'd'],
    [Math.floor((total % 86400) / 3600), 'h'],
    [Math.floor((total % 3600) / 60), 'min'],
    [total % 60, 's'],
  ];
  const first = parts.findIndex(([n]) => n > 0);
  return parts.slice(first, first + 2).filter(([n]) => n > 0).map(([n, u]) => `${n} ${u}`).join(' ');
}

// period writes a limit's period, a Go duration such as "3h0m0s", in
// words: "3 hours". A calendar quota has none.
export function period(p) {
  if (p == null) return '—';
  return goToWords(p);
}

// per is "per" a period: "per minute" for one of a unit, "per 3 hours".
function per(p) {
  const words = period(p);
  return /^1 [a-z]+$/.test(words) ? `per ${words.slice(2)}` : `per ${words}`;
}

// sortOf is what a limit counts, in the page's words: a GCRA rate, a
// calendar quota (a rate limit with a calendar, as the API has it), or a
// concurrency limit. The sort is fixed when a limit is created. A limit
// the page does not know (yet) reads as a rate.
export function sortOf(limit) {
  if (limit?.kind === 'concurrency') return 'concurrency';
  return limit?.calendar ? 'quota' : 'rate';
}

// kindName names a limit's kind as the API does (rate, concurrency), and
// says when a rate limit is a calendar quota: "rate · calendar quota
// (day, Europe/Paris)".
export function kindName(limit) {
  switch (sortOf(limit)) {
    case 'quota': return `rate · calendar quota (${limit.calendar}, ${limit.time_zone})`;
    case 'concurrency': return 'concurrency';
    default: return 'rate';
  }
}

// unitFor is a limit's unit for n of it, in the singular for one:
// "request", "query". The unit is the limit's own word, plural as the API
// has it.
export function unitFor(n, unit) {
  if (n !== 1) return unit;
  if (unit.endsWith('ies')) return `${unit.slice(0, -3)}y`;
  return unit.endsWith('s') && !unit.endsWith('ss') ? unit.slice(0, -1) : unit;
}

// counted writes n of a unit: "1 request", "2 requests".
export function counted(n, unit) {
  return `${n} ${unitFor(n, unit)}`;
}

// paramsOf lists the parameters that a limit of each sort, and an override
// of it, is given: a quota's burst is its count and its window the
// calendar's; a concurrency limit's count is its burst. The others are
// neither shown nor sent.
export const paramsOf = { rate: ['burst', 'count', 'period'], quota: ['count'], concurrency: ['burst', 'period'] };

// allowance says what a limit, an override or a decision (p) lets through
// under its limit, whose sort and calendar it follows.
export function allowance(p, limit) {
  if (p.unlimited) return 'Unlimited: always allowed';
  switch (sortOf(limit)) {
    case 'quota':
      if (p.count === 0) return 'Blocked: count 0 denies every request';
      return `${p.count} per calendar ${limit.calendar} in ${limit.time_zone}`;
    case 'concurrency':
      if (p.burst === 0) return 'Blocked: burst 0 denies every lease';
      return `At most ${p.burst} at once, leases up to ${period(p.period)}`;
    default:
      if (p.burst === 0) return 'Blocked: burst 0 denies every request';
      return `${p.count} ${per(p.period)}, burst ${p.burst}`;
  }
}

function pad(n) {
  return String(n).padStart(2, '0');
}

// toLocalInput is the value of a datetime-local input for an RFC 3339
// time, in the user's time zone, to the minute.
export function toLocalInput(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

// fromLocalInput reads a datetime-local value, which is local time; null
// when it is empty or incomplete.
export function fromLocalInput(value) {
  if (!value) return null;
  const d = new Date(value);
  return Number.isNaN(d.getTime()) ? null : d;
}

// The fields of an override that a person changes, in the order the
// history shows them.
const fields = [
  ['burst', 'Burst'],
  ['count', 'Count'],
  ['period', 'Period'],
  ['unlimited', 'Unlimited'],
  ['enabled', 'Enabled'],
  ['expires_at', 'Expires'],
  ['comment', 'Comment'],
];

function show(key, o) {
  if (!o) return '—';
  const v = o[key];
  switch (key) {
    case 'unlimited':
    case 'enabled':
      return v ? 'yes' : 'no';
    case 'expires_at':
      return v ? `${localTime(new Date(v))} (${utcTime(new Date(v))})` : 'never';
    case 'period':
      return v == null ? '—' : period(v);
    case 'comment':
      return v === '' ? '(none)' : v;
    default:
      return v == null ? '—' : String(v);
  }
}

// changes lists the fields that differ between two versions of an
// override, as {label, before, after}; every field when one side is null
// (a creation or a deletion).
export function changes(before, after) {
  const out = [];
  for (const [key, label] of fields) {
    if (!before || !after || before[key] !== after[key]) {
      out.push({ label, before: show(key, before), after: show(key, after) });
    }
  }
  return out;
}
