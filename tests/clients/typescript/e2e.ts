// The TypeScript client generated from openapi.json (openapi-typescript types + openapi-fetch),
// driven end to end against a running `tidings serve` (embedded backend): infra/clients.sh
// generates generated/schema.d.ts, type-checks this file (strict), compiles it and runs it with
// TIDINGS_URL and TIDINGS_API_KEY (a tenant key).
//
// Every call is typed by the document: paths, parameters, bodies and answers; 409 and 422 come
// back as the `error` of the call, typed as the document's Problem.

import createClient, { type Middleware } from "openapi-fetch";
import type { components, paths } from "./generated/schema.js";

type Problem = components["schemas"]["Problem"];
type NotificationView = components["schemas"]["NotificationView"];
type Delivery = components["schemas"]["Delivery"];

function fail(message: string): never {
  console.error(`typescript client e2e: FAILED: ${message}`);
  process.exit(1);
}

function check(ok: boolean, message: string): asserts ok {
  if (!ok) fail(message);
}

/** The call's error is the document's Problem with this status and code (and field). */
function problem(
  error: Problem | undefined,
  response: Response,
  status: number,
  code: string,
  field?: string,
): Problem {
  check(response.status === status, `expected ${status} ${code}, got ${response.status}`);
  check(error !== undefined, `expected a Problem for ${status} ${code}, got none`);
  const ct = response.headers.get("content-type") ?? "";
  check(ct.startsWith("application/problem+json"), `problem content type ${ct}`);
  check(error.status === status, `problem status ${error.status}: ${JSON.stringify(error)}`);
  check(error.code === code, `problem code ${error.code}, expected ${code}: ${JSON.stringify(error)}`);
  if (field !== undefined) {
    check(error.field === field, `problem field ${error.field}, expected ${field}: ${JSON.stringify(error)}`);
  }
  return error;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function main(): Promise<void> {
  const baseUrl = process.env["TIDINGS_URL"];
  const key = process.env["TIDINGS_API_KEY"];
  if (baseUrl === undefined || key === undefined) fail("TIDINGS_URL and TIDINGS_API_KEY must be set");

  const client = createClient<paths>({ baseUrl, headers: { Authorization: `Bearer ${key}` } });
  // A 5xx is never an answer the document allows: fail at once, whichever call it was.
  const no5xx: Middleware = {
    onResponse({ request, response }) {
      if (response.status >= 500) fail(`${request.method} ${request.url} answered ${response.status}`);
      return undefined;
    },
  };
  client.use(no5xx);

  const run = Math.random().toString(16).slice(2, 12);

  // Two users, so that the deliveries come in more than one page of one.
  const users = [0, 1].map((i) => `ts-${run}-${i}`);
  for (const userId of users) {
    const { data, error, response } = await client.PUT("/v1/users/{user_id}", {
      params: { path: { user_id: userId } },
      body: { email: `${userId}@example.com`, locale: "en", timezone: "Europe/Paris", tags: ["e2e"] },
    });
    check(data !== undefined, `PUT user: ${response.status} ${JSON.stringify(error)}`);
    check(data.user_id === userId && data.email === `${userId}@example.com`, `user as stored: ${JSON.stringify(data)}`);
  }
  const firstUser = users[0] ?? fail("no user");
  const read = await client.GET("/v1/users/{user_id}", { params: { path: { user_id: firstUser } } });
  check(read.data?.email === `${firstUser}@example.com`, `GET user: ${JSON.stringify(read.data ?? read.error)}`);

  // 422 as a typed error: an address that is not one, naming the field.
  {
    const { data, error, response } = await client.PUT("/v1/users/{user_id}", {
      params: { path: { user_id: `ts-${run}-bad` } },
      body: { email: "not an address" },
    });
    check(data === undefined, `a bad email was stored: ${JSON.stringify(data)}`);
    problem(error, response, 422, "invalid_field", "email");
  }

  const templateId = `ts-${run}-shipped`;
  {
    const { data, error, response } = await client.PUT("/v1/templates/{template_id}", {
      params: { path: { template_id: templateId } },
      body: {
        default_locale: "en",
        locales: {
          en: {
            email_subject: "Order {{ order_id }} shipped",
            email_body: "Hello, your order {{ order_id }} is on its way.",
          },
        },
      },
    });
    check(data !== undefined, `PUT template: ${response.status} ${JSON.stringify(error)}`);
  }

  // 422 as a typed error: a template that does not parse, naming the locale's field.
  {
    const { error, response } = await client.PUT("/v1/templates/{template_id}", {
      params: { path: { template_id: `ts-${run}-broken` } },
      body: { default_locale: "en", locales: { en: { email_subject: "Hi", email_body: "Hello {{ order_id" } } },
    });
    problem(error, response, 422, "invalid_field", "locales.en.email_body");
  }

  const request = (orderId: string) => ({
    recipients: { user_ids: users },
    template_id: templateId,
    params: { order_id: orderId },
    category: "transactional" as const,
    channels: ["email" as const],
  });
  // Typed where it is sent: the body openapi-fetch checks against the document.
  const send = (body: ReturnType<typeof request> & { idempotency_key?: string }, idempotencyKey: string) =>
    client.POST("/v1/notifications", { body, params: { header: { "Idempotency-Key": idempotencyKey } } });

  // Send with an Idempotency-Key header; the same key and body again is the same notification.
  const idem = `ts-${run}-order-1`;
  const first = await send(request("1"), idem);
  check(first.response.status === 202 && first.data !== undefined, `send: ${first.response.status} ${JSON.stringify(first.error)}`);
  const notificationId = first.data.notification_id;
  const again = await send(request("1"), idem);
  check(again.response.status === 202, `send again: ${again.response.status} ${JSON.stringify(again.error)}`);
  check(again.data?.notification_id === notificationId, `the same key and body answered ${JSON.stringify(again.data)}`);

  // 409 as a typed error: the same key with another body.
  const conflict = await send(request("2"), idem);
  problem(conflict.error, conflict.response, 409, "idempotency_conflict");

  // 422 as a typed error: the header and the body's idempotency_key differ.
  const differ = await send({ ...request("1"), idempotency_key: `ts-${run}-other` }, idem);
  problem(differ.error, differ.response, 422, "invalid_field", "Idempotency-Key");

  // Its status, until every email has gone to the (fake) provider.
  const deadline = Date.now() + 60_000;
  let view: NotificationView | undefined;
  for (;;) {
    const { data, error, response } = await client.GET("/v1/notifications/{id}", {
      params: { path: { id: notificationId } },
    });
    check(data !== undefined, `GET notification: ${response.status} ${JSON.stringify(error)}`);
    view = data;
    if (view.status === "completed" && view.counts.sent + view.counts.delivered === 2) break;
    if (Date.now() > deadline) fail(`notification ${notificationId} not completed in 60 s: ${JSON.stringify(view)}`);
    await sleep(200);
  }
  check(view.counts.failed === 0 && view.counts.dead === 0, `counts: ${JSON.stringify(view.counts)}`);

  // Its deliveries, one per page, following next_cursor.
  const seen: Delivery[] = [];
  let cursor: string | undefined;
  let pages = 0;
  for (;;) {
    const query: { limit: number; cursor?: string } = cursor === undefined ? { limit: 1 } : { limit: 1, cursor };
    const { data, error, response } = await client.GET("/v1/notifications/{id}/deliveries", {
      params: { path: { id: notificationId }, query },
    });
    check(data !== undefined, `deliveries: ${response.status} ${JSON.stringify(error)}`);
    check(data.items.length <= 1, `limit=1 gave ${data.items.length} items`);
    pages += 1;
    seen.push(...data.items);
    const next = data.next_cursor;
    if (next === undefined || next === null) break;
    cursor = next;
    check(pages < 10, "next_cursor never ends");
  }
  const seenUsers = seen.map((d) => d.user_id).sort();
  check(JSON.stringify(seenUsers) === JSON.stringify([...users].sort()), `deliveries ${JSON.stringify(seen)}`);
  check(seen.every((d) => d.channel === "email"), `channels: ${JSON.stringify(seen)}`);
  check(seen.every((d) => d.status === "sent" || d.status === "delivered"), `statuses: ${JSON.stringify(seen)}`);
  check(pages >= 2, `two deliveries at limit=1 came in ${pages} page(s)`);

  console.log(`typescript client e2e: ok (notification ${notificationId}, ${seen.length} deliveries in ${pages} pages)`);
}

main().catch((e: unknown) => fail(e instanceof Error ? (e.stack ?? e.message) : String(e)));
