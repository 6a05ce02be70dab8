// The page's only way to the service: the public REST API, with the token
// the user pasted in an Authorization header (never in a URL or a cookie).

// The API lives next to /admin/, so a deployment under a path prefix keeps
// working.
const base = new URL('../', document.baseURI);

// ApiError is a failed call: an RFC 9457 problem, or status 0 when the
// service did not answer at all.
export class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.title = problem.title || '';
    this.detail = problem.detail || '';
    this.requestId = problem.request_id || '';
    // Every bad field of a 400 or 422: [{field, message}].
    this.fields = Array.isArray(problem.errors) ? problem.errors : [];
  }
}

// Client calls the API with one token. onUnauthorized runs on every 401, so
// that a revoked token sends the user back to the sign-in form.
export class Client {
  #token;
  #onUnauthorized;

  constructor(token, onUnauthorized = () => {}) {
    this.#token = token;
    this.#onUnauthorized = onUnauthorized;
  }

  // call sends one request and returns {data, etag}; it throws an ApiError
  // for anything but a 2xx. path is relative to the API root ("v1/limits").
  async call(method, path, { query, body, ifMatch, contentType = 'application/json' } = {}) {
    const url = new URL(path, base);
    for (const [key, value] of Object.entries(query ?? {})) {
      // The API treats an empty parameter as not given; leave it out.
      if (value !== '' && value != null) url.searchParams.set(key, value);
    }
    const headers = {
      Authorization: `Bearer ${this.#token}`,
      Accept: 'application/json, application/problem+json',
    };
    if (body !== undefined) headers['Content-Type'] = contentType;
    if (ifMatch) headers['If-Match'] = ifMatch;
    let res;
    try {
      res = await fetch(url, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        cache: 'no-store',
        credentials: 'omit',
      });
    } catch (err) {
      throw new ApiError(0, { title: 'No answer', detail: `ratelimitd did not answer (${err.message}).` });
    }
    const text = res.status === 204 ? '' : await res.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch {
      data = null;
    }
    if (!res.ok) {
      if (res.status === 401) this.#onUnauthorized();
      throw new ApiError(res.status, data ?? { title: res.statusText, detail: text.slice(0, 200) });
    }
    return { data, etag: res.headers.get('ETag') };
  }
}

// wording is the heading and the advice for each status a person meets.
const wording = {
  0: ['ratelimitd did not answer', 'Check your connection, then try again.'],
  400: ['The request was malformed (400)', 'See the messages beside the fields.'],
  401: ['Token not accepted (401)', 'The token is unknown or was revoked: paste a valid one.'],
  403: ['Not allowed (403)', "Your token's scope does not allow this. Ask an admin if you need it."],
  404: ['Not found (404)', 'It may have been deleted by someone else.'],
  409: ['Conflict (409)', ''],
  412: ['Changed by someone else (412)', 'It was reloaded: check it and make your change again.'],
  422: ['Some values are invalid (422)', 'See the messages beside the fields.'],
  503: ['Service unavailable (503)', 'A database or store that ratelimitd needs does not answer. Try again in a moment.'],
};

// describe words an error for people: a heading, the API's own detail, and
// what to do about it.
export function describe(err) {
  if (!(err instanceof ApiError)) {
    return { heading: 'Something went wrong in this page', detail: String(err?.message ?? err), hint: 'Reload the page and try again.' };
  }
  const [heading, hint] = wording[err.status] ?? (err.status >= 500
    ? [`Server error (${err.status})`, 'Try again; if it keeps failing, report the request id.']
    : [`${err.title || 'Error'} (${err.status})`, '']);
  return { heading, detail: err.detail, hint };
}
