// The README's ten requests, and the few things a client author tripped
// over besides, through openapi-fetch with the types openapi-typescript
// generated from openapi.yaml with its default settings (./api.d.ts).
// e2e's TestGeneratedTypeScriptClient generates them, compiles this file
// with tsc --strict and runs it with node against a fresh service, given
// as RATELIMIT_URL and RATELIMIT_ADMIN_TOKEN. It stops at the first answer
// that is not the one the README shows, and exits 1.
import createClient from "openapi-fetch";
import type { components, paths } from "./api.js";

type Problem = components["schemas"]["Problem"];

const baseUrl = process.env.RATELIMIT_URL;

function newClient(token?: string) {
  return createClient<paths>({ baseUrl, headers: token ? { Authorization: `Bearer ${token}` } : {} });
}

function check(ok: unknown, what: string, answer?: unknown): asserts ok {
  if (!ok) {
    console.error(`tour: ${what}: ${JSON.stringify(answer)}`);
    process.exit(1);
  }
}

function fields(p: Problem | undefined): string {
  return (p?.errors ?? []).map((e) => e.field).join(" ");
}

const admin = newClient(process.env.RATELIMIT_ADMIN_TOKEN);

// 1. Ready, without a token.
const ready = await newClient().GET("/readyz");
check(ready.data?.status === "ok", "readyz", ready.error);

// 2. A limit of Let's Encrypt's catalogue; unit and shadow left out.
const orders = await admin.PUT("/v1/limits/{name}", {
  params: { path: { name: "NewOrdersPerAccount" } },
  body: { id_format: "reg_id", burst: 300, count: 300, period: "3h" },
});
check(orders.response.status === 201 && orders.data, "the created limit", orders.error);
check(orders.data.enum === 3 && orders.data.period === "3h0m0s" && orders.data.unit === "requests", "the created limit", orders.data);

// 3. A token of scope decide, its secret shown once.
const created = await admin.POST("/v1/tokens", { body: { name: "orders-service", scope: "decide" } });
check(created.data && created.data.token.startsWith("rlt_"), "the created token", created.error);
const decide = newClient(created.data.token);

async function spend(limit: string, bucket_id: string) {
  const res = await decide.POST("/v1/spend", { body: { buckets: [{ limit, bucket_id }] } });
  check(res.data, `a spend of ${limit} ${bucket_id}`, res.error);
  return { result: res.data, decision: res.data.decisions[0], headers: res.response.headers };
}

// 4. A spend, cost left out (1); the headers describe the bucket.
let s = await spend("NewOrdersPerAccount", "12345678");
check(s.result.allowed && s.decision.remaining === 299 && s.decision.source === "default" && s.decision.reason === null, "the first spend", s.result);
check(s.headers.get("RateLimit-Policy") === `"NewOrdersPerAccount";q=300;w=10800`, "RateLimit-Policy", s.headers.get("RateLimit-Policy"));

// 5. A limit outside the catalogue gets the enum 100.
const resets = await admin.PUT("/v1/limits/{name}", {
  params: { path: { name: "PasswordResetsPerAccount" } },
  body: { id_format: "reg_id", burst: 1, count: 1, period: "1m" },
});
check(resets.response.status === 201 && resets.data?.enum === 100, "the second limit", resets.data ?? resets.error);

// 6. and 7. The first reset is allowed and empties the bucket; the second
// is denied, with Retry-After.
s = await spend("PasswordResetsPerAccount", "42");
check(s.result.allowed && s.decision.remaining === 0, "the first reset", s.result);
s = await spend("PasswordResetsPerAccount", "42");
check(!s.result.allowed && s.decision.reason === "limited" && s.decision.retry_after_ms > 0 && Number(s.headers.get("Retry-After")) >= 1,
  "the second reset", s.result);

// 8. An override, in another notation of the id; unlimited and enabled
// left out.
const oc = await admin.POST("/v1/overrides", {
  body: { limit: "PasswordResetsPerAccount", bucket_id: "0007", burst: 5, count: 5, period: "1m", comment: "Ticket 4711" },
});
check(oc.response.status === 201 && oc.data, "the override", oc.error);
const o = oc.data;
check(o.bucket_id === "7" && o.enabled && !o.unlimited && o.expires_at === null && oc.response.headers.get("ETag") === `"1"`, "the override", o);

// 9. The next spend for account 7 already gets it.
s = await spend("PasswordResetsPerAccount", "7");
check(s.decision.allowed && s.decision.source === "override" && s.decision.remaining === 4, "a spend of the override", s.result);

// 10. Bad values: a 422 problem naming every field, in body order.
const bad = await admin.POST("/v1/overrides", {
  body: { limit: "PasswordResetsPerAccount", bucket_id: "acct-42", burst: -5, period: "3 hours" },
});
check(bad.response.status === 422 && fields(bad.error) === "bucket_id burst period count", "the bad override", bad.error);

// Beyond the README. An expiry set, kept by a PATCH that leaves it out,
// and cleared by one that sends null.
async function patch(body: components["schemas"]["OverridePatch"]) {
  const res = await admin.PATCH("/v1/overrides/{id}", { params: { path: { id: o.id } }, body });
  check(res.data, "a patch", res.error);
  return res.data;
}
const expiry = new Date(Date.now() + 24 * 3600 * 1000);
expiry.setUTCMilliseconds(0);
let p = await patch({ expires_at: expiry.toISOString() });
check(p.expires_at !== null && Date.parse(p.expires_at) === expiry.getTime(), "an expiry set", p);
p = await patch({ comment: "Ticket 4712" });
check(p.expires_at !== null && Date.parse(p.expires_at) === expiry.getTime(), "an expiry left out", p);
p = await patch({ expires_at: null });
check(p.expires_at === null && p.comment === "Ticket 4712", "an expiry cleared", p);

// An import sent as YAML text (openapi-fetch would send any body as JSON),
// one refused with the line of its bad entry, and an export read as text.
function importYAML(kind: "defaults" | "overrides" | "envoy", doc: string, dry_run?: boolean) {
  return admin.POST("/v1/import", {
    params: { query: { kind, dry_run } },
    body: doc,
    bodySerializer: (text) => text,
    headers: { "Content-Type": "application/yaml" },
  });
}
const doc = "PasswordResetsPerAccount:\n  burst: 2\n  count: 2\n  period: 1m\n  id_format: reg_id\n";
const dry = await importYAML("defaults", doc, true);
check(dry.data?.updated === 1, "a dry run", dry.error);
const refused = await importYAML("defaults", "Fine:\n  burst: 1\n  count: 1\n  period: 1m\n  id_format: string\nBad:\n  burst: 1\n  count: 1\n  period: 1m\n");
// error is the union of every status's problem; the counts tell an
// import's 422 from the others.
const problem = refused.error;
check(refused.response.status === 422 && problem && "created" in problem && problem.created === 0 && problem.errors.length === 1, "a bad import", problem);
check(problem.errors[0].line === 6 && problem.errors[0].entry === "Bad", "a bad import", problem);
const exported = await admin.GET("/v1/export", { params: { query: { kind: "defaults" } }, parseAs: "text" });
check(exported.data?.includes("PasswordResetsPerAccount:"), "the export", exported.data ?? exported.error);

// Many decisions in one request, each answered as its route would, in
// order (the check sees the spend), a refused one as its problem.
const many = await decide.POST("/v1/decisions", {
  body: {
    requests: [
      { op: "spend", buckets: [{ limit: "PasswordResetsPerAccount", bucket_id: "8" }] },
      { op: "check", buckets: [{ limit: "PasswordResetsPerAccount", bucket_id: "8", cost: 0 }] },
      { op: "spend", buckets: [{ limit: "Nope", bucket_id: "8" }] },
    ],
  },
});
check(many.data, "many decisions", many.error);
const [spent8, checked8, refused8] = many.data.results;
check("decisions" in spent8 && spent8.allowed && "decisions" in checked8 && checked8.decisions[0].remaining === 0, "many decisions", many.data);
check("problem" in refused8 && refused8.problem.status === 422 && fields(refused8.problem) === "buckets[0].limit", "many decisions", many.data);

// A path that is no limit name.
const named = await admin.GET("/v1/limits/{name}", { params: { path: { name: "1bad" } } });
check(named.response.status === 422 && fields(named.error) === "name", "GET /v1/limits/1bad", named.error);
console.log("tour: every answer as expected");
