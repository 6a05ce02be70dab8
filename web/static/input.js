// What people type into the page, read into what the API takes. A length
// of time is written as people write it ("1 minute", "90 seconds",
// "2h30m", "1h 30m", "3 hours", "1 day") and sent as the Go duration the
// API's contract takes; a count is a whole number. What cannot be read is
// answered in words beside its field, and nothing half-read is sent.

// Nanoseconds per unit, and the words people write for each.
const units = [
  [1n, ['ns', 'nanosecond', 'nanoseconds']],
  [1000n, ['us', 'µs', 'μs', 'microsecond', 'microseconds']],
  [1000000n, ['ms', 'msec', 'msecs', 'millisecond', 'milliseconds']],
  [1000000000n, ['s', 'sec', 'secs', 'second', 'seconds']],
  [60000000000n, ['m', 'min', 'mins', 'minute', 'minutes']],
  [3600000000000n, ['h', 'hr', 'hrs', 'hour', 'hours']],
  [86400000000000n, ['d', 'day', 'days']],
  [604800000000000n, ['w', 'wk', 'wks', 'week', 'weeks']],
];
const unitNs = new Map(units.flatMap(([ns, names]) => names.map((n) => [n, ns])));

// The longest Go duration, 2^63 - 1 nanoseconds: about 292 years.
const maxNs = (1n << 63n) - 1n;

// A part is a number and its unit; parts may be run together ("2h30m") or
// apart ("2 hours, 30 minutes", "1 hour and 30 minutes").
const part = /(\d+(?:\.\d*)?|\.\d+)\s*([a-zµμ]+)\s*/y;
const example = '“90 seconds”, “1 minute”, “2h30m” or “1 day”';

// parseDuration reads a length of time: {ns} (a BigInt) or {error}, a
// sentence for the person who typed it. An empty text is an error too;
// callers leave an empty field out before.
export function parseDuration(text) {
  const s = text.trim().toLowerCase().replace(/,|\band\b/g, ' ').trim();
  if (s === '') return { error: `Enter a length of time, such as ${example}.` };
  if (s.length > 100) return { error: 'That is too long for a length of time.' };
  if (/^[-−]/.test(s)) return { error: `A length of time cannot be negative: write one such as ${example}.` };
  if (/^\d+(\.\d*)?$/.test(s)) {
    const n = s.replace(/\.$/, '');
    return { error: `Add a unit: “${n} seconds”, “${n} minutes” or “${n} hours”.` };
  }
  if (/\d[e][+-]?\d/.test(s)) return { error: `Write the number in digits, without an exponent, such as ${example}.` };
  let ns = 0n;
  part.lastIndex = 0;
  while (part.lastIndex < s.length) {
    const at = part.lastIndex;
    const m = part.exec(s);
    if (!m) {
      return { error: at === 0 ? `Not a length of time: write one such as ${example}.` : `Only the start could be read: write it such as ${example}.` };
    }
    const size = unitNs.get(m[2]);
    if (size === undefined) {
      return { error: `“${m[2]}” is not a unit of time here: use seconds, minutes, hours, days or weeks, such as ${example}.` };
    }
    const [whole, frac = ''] = m[1].split('.');
    ns += BigInt(whole || '0') * size + (frac === '' ? 0n : BigInt(frac) * size / 10n ** BigInt(frac.length));
    if (ns > maxNs) return { error: 'That is longer than ratelimitd can count (about 292 years).' };
  }
  return { ns };
}

// goDuration writes nanoseconds as Go's time.Duration.String does:
// "2h30m0s", "1m30.5s", "500ms".
export function goDuration(ns) {
  if (ns === 0n) return '0s';
  const second = 1000000000n;
  if (ns < second) {
    return ns % 1000000n === 0n ? `${ns / 1000000n}ms` : ns % 1000n === 0n ? `${ns / 1000n}µs` : `${ns}ns`;
  }
  const h = ns / 3600000000000n;
  const m = (ns / 60000000000n) % 60n;
  const whole = (ns / second) % 60n;
  const frac = (ns % second).toString().padStart(9, '0').replace(/0+$/, '');
  const s = `${whole}${frac ? `.${frac}` : ''}s`;
  if (h > 0n) return `${h}h${m}m${s}`;
  if (m > 0n) return `${m}m${s}`;
  return s;
}

// The units that words use, largest first.
const wordUnits = [
  [86400000000000n, 'day'], [3600000000000n, 'hour'], [60000000000n, 'minute'], [1000000000n, 'second'],
  [1000000n, 'millisecond'], [1000n, 'microsecond'], [1n, 'nanosecond'],
];

// durationWords writes nanoseconds for people, exactly: "1 day",
// "2 hours 30 minutes", "1 minute 30 seconds". It reads back as the same
// duration.
export function durationWords(ns) {
  if (ns === 0n) return '0 seconds';
  const out = [];
  let rest = ns;
  for (const [size, name] of wordUnits) {
    const n = rest / size;
    rest %= size;
    if (n > 0n) out.push(`${n} ${n === 1n ? name : `${name}s`}`);
  }
  return out.join(' ');
}

// goToWords writes a duration the API gave (a Go duration) in words; what
// it cannot read is shown as it came.
export function goToWords(go) {
  const { ns } = parseDuration(go);
  return ns === undefined ? go : durationWords(ns);
}

// watchDuration says beside a duration field, while the user types, how
// the page reads what is typed: "Reads as 1 minute 30 seconds." What it
// cannot read is said on saving, beside the field, as every field error.
// The words go in the element whose id is the field's with "-words".
export function watchDuration(input) {
  input.addEventListener('input', () => sayDuration(input));
}

// sayDuration shows how the page reads a duration field now, after the
// page itself filled it.
export function sayDuration(input) {
  const text = input.value.trim();
  const { ns } = text === '' ? {} : parseDuration(text);
  document.getElementById(`${input.id}-words`).textContent = ns === undefined ? '' : `Reads as ${durationWords(ns)}.`;
}

// readParams reads the parameters keys of a form (burst, count, period)
// as the API takes them: {values, errors}, errors as the API words them,
// [{field, message}], each in words. An empty field is left out, and the
// API says which are required.
export function readParams(form, keys) {
  const values = {};
  const errors = [];
  for (const key of keys) {
    const input = form.elements[key];
    const text = input.value.trim();
    if (key === 'period') {
      if (text === '') continue;
      const { ns, error } = parseDuration(text);
      if (error) errors.push({ field: key, message: error });
      else values[key] = goDuration(ns);
      continue;
    }
    // A number input holds "" for what it cannot read (1e400, "ten").
    if (input.validity.badInput) {
      errors.push({ field: key, message: 'Enter a whole number, such as 300.' });
    } else if (text === '') {
      continue;
    } else if (!/^\d+$/.test(text)) {
      errors.push({ field: key, message: 'Enter a whole number, such as 300, without a sign, a fraction or an exponent.' });
    } else if (!Number.isSafeInteger(Number(text))) {
      errors.push({ field: key, message: `Too large: at most ${Number.MAX_SAFE_INTEGER.toLocaleString('en-US')}.` });
    } else {
      values[key] = Number(text);
    }
  }
  return { values, errors };
}
