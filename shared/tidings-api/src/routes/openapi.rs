//! The OpenAPI 3.1 document of the whole API, generated from the handlers' `#[utoipa::path]`
//! attributes and the types' `ToSchema` derives, served at `GET /openapi.json`. Schemathesis
//! fuzzes `tidings serve` with it in the test command (`infra/test.sh`).

use axum::Router;
use axum::routing::get;
use tidings_core::people::zones::Zone;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi as Document, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use crate::problem::Problem;
use crate::state::AppState;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tidings",
        description = "Notifications (email, SMS, push, in-app inbox) and inventory with back-in-stock \
                       alerts. Errors are RFC 9457 problem documents with a stable `code`. Every `/v1` \
                       route but the live feed needs `Authorization: Bearer <api key>`: a tenant key for \
                       a tenant's data, an operator key for `/v1/ops` and `/v1/admin`. The `dev` routes \
                       exist only under `tidings serve`. Every answer has an `x-request-id` header (the \
                       client's own when it sent a valid one), repeated as `request_id` in problem \
                       documents and in the server's log lines of the request.",
        license(name = "Apache-2.0")
    ),
    paths(healthz),
    components(schemas(Problem)),
    tags(
        (name = "users"), (name = "preferences"), (name = "devices"), (name = "templates"),
        (name = "notifications"), (name = "inbox"), (name = "inventory"), (name = "restock"),
        (name = "ops", description = "Operators' view of the system: an operator key"),
        (name = "admin", description = "API keys: an operator key"), (name = "callbacks"), (name = "tracking"),
        (name = "webhooks", description = "Endpoints the shop is posted events to, signed as Standard Webhooks says"),
        (name = "me", description = "A user's own inbox and preferences, with the user token of `POST /v1/users/{user_id}/inbox/token` (docs/site.md); CORS for the tenant's allowed origins only"),
        (name = "site", description = "The shop's own site: the origins allowed to call `/v1/me`, and the hosted preferences page"),
        (name = "dev", description = "Local development hooks: only `tidings serve` has them")
    )
)]
struct ApiDoc;

/// Liveness.
#[utoipa::path(get, path = "/healthz", tag = "ops",
    responses((status = 200, description = "The process is up", body = String, content_type = "text/plain")))]
async fn healthz() -> &'static str {
    "ok"
}

/// The whole document: every route module's paths, as JSON (what `GET /openapi.json` serves).
pub fn document() -> serde_json::Value {
    let mut doc = ApiDoc::openapi();
    for part in [
        super::users::Api::openapi(),
        super::templates::Api::openapi(),
        super::notifications::Api::openapi(),
        super::inbox::Api::openapi(),
        super::live::Api::openapi(),
        super::inventory::Api::openapi(),
        super::ops::Api::openapi(),
        super::admin::Api::openapi(),
        super::dev::Api::openapi(),
        super::preferences::Api::openapi(),
        super::devices::Api::openapi(),
        super::restock::Api::openapi(),
        super::callbacks::Api::openapi(),
        super::tracking::Api::openapi(),
        super::webhooks::Api::openapi(),
        super::workflows::Api::openapi(),
        super::me::Api::openapi(),
        super::site::Api::openapi(),
    ] {
        doc.merge(part);
    }
    Conventions.modify(&mut doc);
    exact(doc)
}

/// An id a client gives (`tidings_core::ids::check_id`): 1 to 128 of `[A-Za-z0-9._:@+-]`.
fn id_schema() -> serde_json::Value {
    serde_json::json!({"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[A-Za-z0-9._:@+-]+$"})
}

/// Path parameters checked as ids, by name.
const ID_PATH_PARAMS: [&str; 9] = [
    "user_id",
    "template_id",
    "workflow_id",
    "sku_id",
    "order_id",
    "subscription_id",
    "id",
    "message_id",
    "location_id",
];

/// Body properties checked as ids: `(schema, property)`; a property of type array has id items.
const ID_PROPERTIES: [(&str, &str); 15] = [
    ("DeviceInput", "user_id"),
    ("BatchUser", "user_id"),
    ("AdjustmentRequest", "idempotency_key"),
    ("OrderRequest", "order_id"),
    ("OrderRequest", "user_id"),
    ("OrderRequest", "category"),
    ("WarmUpRequest", "category"),
    ("OrderLine", "sku_id"),
    ("SubscriptionRequest", "user_id"),
    ("SubscriptionRequest", "sku_id"),
    ("SubscriptionRequest", "spu_id"),
    ("ResendRequest", "batch_no"),
    ("NotificationRequest", "template_id"),
    ("Recipients", "segment"),
    ("Recipients", "user_ids"),
];

/// What the server enforces beyond the types utoipa derives, stated where it applies (the
/// rules live in `tidings-core`; the tests below check a few of them against the server):
/// ids' patterns and lengths, `limit` ranges, push tokens, HH:MM times, shard counts.
fn exact(doc: Document) -> serde_json::Value {
    let mut v = serde_json::to_value(&doc).unwrap_or_default();
    if let Some(schemas) = v.pointer_mut("/components/schemas").and_then(serde_json::Value::as_object_mut) {
        name_step_kinds(schemas);
    }
    constrain(&mut v);
    link(&mut v);
    v
}

/// A workflow step (`tidings_core::workflows::StepDef`, tagged by `type`) as one named schema per
/// kind (`StepDigest`, `StepSend`, …) and a discriminator: a branch's `then` and `else` hold
/// steps, and the generators follow that recursion only through named schemas.
fn name_step_kinds(schemas: &mut serde_json::Map<String, serde_json::Value>) {
    use serde_json::{Value, json};
    let Some(kinds) = schemas.get_mut("StepDef").and_then(|s| s.get_mut("oneOf")).map(Value::take) else { return };
    let mut refs = Vec::new();
    let mut mapping = serde_json::Map::new();
    for kind in kinds.as_array().into_iter().flatten() {
        let Some(tag) = kind.pointer("/properties/type/enum/0").and_then(Value::as_str) else { continue };
        let name = format!("Step{}{}", tag[..1].to_uppercase(), &tag[1..]);
        let reference = format!("#/components/schemas/{name}");
        mapping.insert(tag.to_owned(), json!(reference));
        refs.push(json!({"$ref": reference}));
        // `deny_unknown_fields`, as the other bodies say it.
        let mut kind = kind.clone();
        kind["additionalProperties"] = json!(false);
        schemas.insert(name, kind);
    }
    if let Some(step) = schemas.get_mut("StepDef") {
        step["oneOf"] = Value::Array(refs);
        step["discriminator"] = json!({"propertyName": "type", "mapping": mapping});
    }
}

/// The chains a client follows (and schemathesis' stateful phase with it): `(from path, from
/// method, statuses, link name, to operationId, to's parameters as runtime expressions)`.
type Link = (
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

const USER: &[(&str, &str)] = &[("user_id", "$request.path.user_id")];
const NOTIFICATION: &[(&str, &str)] = &[("id", "$response.body#/notification_id")];
const TEMPLATE: &[(&str, &str)] = &[("template_id", "$request.path.template_id")];
const ORDER: &[(&str, &str)] = &[("order_id", "$response.body#/order_id")];
const SUBSCRIPTION: &[(&str, &str)] = &[("subscription_id", "$response.body#/subscription_id")];

const LINKS: &[Link] = &[
    ("/v1/users/{user_id}", "put", &["200"], "GetUser", "users_get_user", USER),
    ("/v1/users/{user_id}", "put", &["200"], "GetPreferences", "preferences_get_preferences", USER),
    ("/v1/users/{user_id}", "put", &["200"], "PutPreferences", "preferences_put_preferences", USER),
    ("/v1/users/{user_id}", "put", &["200"], "ListInbox", "inbox_list", USER),
    ("/v1/users/{user_id}", "put", &["200"], "ListDevices", "devices_list_devices", USER),
    ("/v1/users/{user_id}", "put", &["200"], "ListStockSubscriptions", "restock_list_for_user", USER),
    ("/v1/users/{user_id}", "put", &["200"], "EraseUser", "users_erase_user", USER),
    ("/v1/notifications", "post", &["202"], "GetNotification", "notifications_show", NOTIFICATION),
    ("/v1/notifications", "post", &["202"], "ListDeliveries", "notifications_deliveries", NOTIFICATION),
    ("/v1/notifications", "post", &["202"], "CancelNotification", "notifications_cancel", NOTIFICATION),
    (
        "/v1/notifications/{id}",
        "get",
        &["200"],
        "ListDeliveries",
        "notifications_deliveries",
        &[("id", "$request.path.id")],
    ),
    ("/v1/templates/{template_id}", "put", &["200"], "GetTemplate", "templates_get_template", TEMPLATE),
    ("/v1/templates/{template_id}", "put", &["200"], "PreviewTemplate", "templates_preview_template", TEMPLATE),
    ("/v1/orders", "post", &["200", "201"], "GetOrder", "inventory_show_order", ORDER),
    ("/v1/orders", "post", &["200", "201"], "PayOrder", "inventory_pay", ORDER),
    ("/v1/orders", "post", &["200", "201"], "CancelOrder", "inventory_cancel", ORDER),
    ("/v1/stock-subscriptions", "post", &["200", "201"], "CancelSubscription", "restock_cancel", SUBSCRIPTION),
    (
        "/v1/inventory/{sku_id}",
        "put",
        &["200"],
        "GetStock",
        "inventory_show_stock",
        &[("sku_id", "$request.path.sku_id")],
    ),
    ("/v1/inventory/{sku_id}", "put", &["200"], "GetLedger", "inventory_ledger", &[("sku_id", "$request.path.sku_id")]),
];

/// A user written with `PUT /v1/users/{user_id}` is the recipient of a notification: the link
/// carries the body, with the user's id in it.
fn link(v: &mut serde_json::Value) {
    use serde_json::{Value, json};
    let ids: std::collections::BTreeSet<String> = v["paths"]
        .as_object()
        .into_iter()
        .flat_map(|p| p.values())
        .filter_map(Value::as_object)
        .flat_map(|item| item.values())
        .filter_map(|op| op["operationId"].as_str().map(str::to_owned))
        .collect();
    for (path, method, statuses, name, to, params) in LINKS {
        if !ids.contains(*to) {
            continue;
        }
        let parameters: serde_json::Map<String, Value> =
            params.iter().map(|(k, e)| ((*k).to_owned(), Value::from(*e))).collect();
        for status in *statuses {
            let pointer = format!("/paths/{}/{method}/responses/{status}", path.replace('~', "~0").replace('/', "~1"));
            if let Some(response) = v.pointer_mut(&pointer).and_then(Value::as_object_mut) {
                let links = response.entry("links").or_insert_with(|| json!({}));
                links[*name] = json!({"operationId": to, "parameters": parameters});
            }
        }
    }
    let send = json!({
        "operationId": "notifications_create",
        "requestBody": {
            "recipients": {"user_ids": ["$request.path.user_id"]},
            "template_id": "welcome",
            "category": "transactional",
            "channels": ["inapp"]
        }
    });
    if ids.contains("notifications_create")
        && let Some(response) =
            v.pointer_mut("/paths/~1v1~1users~1{user_id}/put/responses/200").and_then(Value::as_object_mut)
    {
        let links = response.entry("links").or_insert_with(|| json!({}));
        links["SendToUser"] = send;
    }
}

fn constrain(v: &mut serde_json::Value) {
    use serde_json::{Value, json};
    if let Some(paths) = v.get_mut("paths").and_then(Value::as_object_mut) {
        for (path, item) in paths.iter_mut() {
            let Some(item) = item.as_object_mut() else { continue };
            for op in item.values_mut() {
                // Public routes (health, tracking links, unsubscribe pages, provider callbacks,
                // the live feed's own token) say so: no API key.
                if let Some(op) = op.as_object_mut() {
                    op.entry("security").or_insert_with(|| json!([]));
                }
                let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) else { continue };
                for param in params {
                    let name = param["name"].as_str().unwrap_or_default().to_owned();
                    let place = param["in"].as_str().unwrap_or_default().to_owned();
                    let schema = match (place.as_str(), name.as_str()) {
                        ("path", n) if ID_PATH_PARAMS.contains(&n) => id_schema(),
                        ("path", "token") if path.starts_with("/v1/devices/") => {
                            json!({"type": "string", "minLength": 1, "maxLength": 4096, "pattern": "^[^\\s\\x00-\\x1f\\x7f-\\x9f]+$"})
                        }
                        // `tidings_core::restock::analytics`: a page of SKUs, each a figure set.
                        ("query", "limit") if path == "/v1/restock/analytics" => {
                            json!({"type": "integer", "minimum": 1, "maximum": 100, "default": 20})
                        }
                        ("query", "limit") => {
                            json!({"type": "integer", "minimum": 1, "maximum": 500, "default": 50})
                        }
                        ("query", "template_id" | "sku_id") => id_schema(),
                        ("query", "since") => json!({"type": "string", "format": "date-time"}),
                        // `admin::tenant_param`: a tenant id.
                        ("query", "tenant") if path == "/v1/admin/keys" => id_schema(),
                        // `dev::channel_of`: the channels with a fake provider.
                        ("query" | "path", "channel") if path.starts_with("/dev/") => {
                            json!({"type": "string", "enum": ["email", "sms", "push"]})
                        }
                        // `tidings_core::ports::QueryOpts::cursor`: any hex string is a position.
                        ("query", "cursor") => json!({"type": "string", "pattern": "^([0-9A-Fa-f]{2})*$"}),
                        // `tidings_core::restock::list_notices`: every notice status is listed.
                        ("query", "status") if path == "/v1/ops/restock-notices" => {
                            let all: Vec<&str> =
                                tidings_core::restock::model::NoticeStatus::ALL.iter().map(|s| s.as_str()).collect();
                            json!({"type": "string", "enum": all, "default": "MANUAL"})
                        }
                        // `tidings_core::inventory::FindingStatus`.
                        ("query", "status") if path == "/v1/ops/inventory-findings" => {
                            json!({"type": "string", "enum": ["open", "settled"], "default": "open"})
                        }
                        _ => continue,
                    };
                    param["schema"] = schema;
                }
            }
        }
    }
    let Some(schemas) = v.pointer_mut("/components/schemas").and_then(Value::as_object_mut) else { return };
    for (schema, property) in ID_PROPERTIES {
        let Some(prop) = schemas.get_mut(schema).and_then(|s| s.pointer_mut(&format!("/properties/{property}"))) else {
            continue;
        };
        let nullable = prop["type"].as_array().is_some_and(|t| t.iter().any(|t| t == "null"));
        let is_array =
            prop["type"] == "array" || prop["type"].as_array().is_some_and(|t| t.iter().any(|t| t == "array"));
        if is_array {
            prop["items"] = id_schema();
        } else {
            let description = prop.get("description").cloned();
            *prop = id_schema();
            if nullable {
                prop["type"] = json!(["string", "null"]);
            }
            if let Some(d) = description {
                prop["description"] = d;
            }
        }
    }
    if let Some(prop) = schemas.get_mut("DeviceInput").and_then(|s| s.pointer_mut("/properties/token")) {
        *prop =
            json!({"type": "string", "minLength": 1, "maxLength": 4096, "pattern": "^[^\\s\\x00-\\x1f\\x7f-\\x9f]+$"});
    }
    if let Some(q) = schemas.get_mut("QuietHours").and_then(|s| s.get_mut("properties")) {
        for end in ["start", "end"] {
            q[end] = json!({"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$", "example": if end == "start" { "22:00" } else { "08:00" }});
        }
    }
    // `tidings_core::templates::locales_of`: keys as a user's `locale`, each an object, one at least.
    if let Some(t) = schemas.get_mut("TemplateInput") {
        if let Some(locales) = t.pointer_mut("/properties/locales") {
            locales["minProperties"] = json!(1);
            locales["propertyNames"] = json!({"type": "string", "pattern": "^[A-Za-z0-9_-]{1,35}$"});
        }
        t["example"] = json!({
            "default_locale": "en",
            "locales": {
                "en": {"email_subject": "Order {{ order_id }} shipped", "email_body": "Hi {{ name }}, order {{ order_id }} is on its way.", "sms": "Order {{ order_id }} shipped", "inapp_body": "Order {{ order_id }} shipped"},
                "zh-CN": {"sms": "订单 {{ order_id }} 已发货"}
            }
        });
    }
    if let Some(shards) = schemas.get_mut("WarmUpRequest").and_then(|s| s.pointer_mut("/properties/shards")) {
        shards["minimum"] = json!(1);
        shards["maximum"] = json!(tidings_core::inventory::MAX_SHARDS);
    }
    constrain_bodies(schemas);
    for (schema, example) in request_examples() {
        if let Some(s) = schemas.get_mut(schema) {
            s["example"] = example;
        }
    }
}

/// One valid body per request schema, which the server takes (the test `every_example_body_is_taken`
/// sends each, after the fixtures it names: the template `order_shipped`, the user `u1`, stock of
/// `sku-1001`). They are what the reference page (`/docs`) shows and what a client copies first.
pub fn request_examples() -> Vec<(&'static str, serde_json::Value)> {
    use serde_json::json;
    vec![
        (
            "UserInput",
            json!({"email": "alice@example.com", "phone": "+14155550100", "locale": "en", "timezone": "America/New_York", "tags": ["vip"]}),
        ),
        (
            "PreferencesInput",
            json!({"categories": {"marketing": false}, "channels": {"sms": false}, "quiet_hours": {"start": "22:00", "end": "08:00"}}),
        ),
        (
            "DeviceInput",
            json!({"user_id": "u1", "platform": "ios", "token": "740f4707bebcf74f9b7c25d48e3358945f6aa01da5ddb387462c7eaf61bb78ad"}),
        ),
        (
            "NotificationRequest",
            json!({
                "idempotency_key": "order-123-shipped",
                "recipients": {"user_ids": ["u1"]},
                "template_id": "order_shipped",
                "params": {"order_id": "123", "name": "Alice"},
                "category": "transactional",
                "channels": ["email", "inapp"],
                "priority": "high"
            }),
        ),
        (
            "PreviewRequest",
            json!({"params": {"order_id": "123", "name": "Alice"}, "locale": "en", "channels": ["email", "sms"], "user_id": "u1"}),
        ),
        ("WarmUpRequest", json!({"on_hand": 100, "category": "default"})),
        ("AdjustmentRequest", json!({"delta": 20, "source": "purchase_order", "idempotency_key": "po-7781"})),
        (
            "OrderRequest",
            json!({"order_id": "order-123", "user_id": "u1", "items": [{"sku_id": "sku-1001", "qty": 2}], "hold_seconds": 900}),
        ),
        ("LocationRequest", json!({"name": "Main warehouse", "markets": ["US", "CA"], "priority": 1})),
        ("LocationStockRequest", json!({"on_hand": 40, "safety_stock": 2})),
        ("StockPolicy", json!({"backorder_limit": 50, "preorder": {"until": "2030-03-01T00:00:00Z", "limit": 200}})),
        ("IncomingRequest", json!({"ref": "po-7782", "qty": 40, "expected_at": "2026-12-20T09:00:00Z"})),
        ("SubscriptionRequest", json!({"user_id": "u1", "sku_id": "sku-1001", "notify_incoming": true})),
        (
            "StockEvent",
            json!({"event": "stock.in", "skuId": "sku-1001", "qty": 50, "source": "purchase_order", "eventId": "evt-20261205-0001"}),
        ),
        ("ResendRequest", json!({"batch_no": "batch-1"})),
        (
            "WorkflowInput",
            json!({
                "name": "Order updates",
                "category": "transactional",
                "steps": [
                    {"type": "digest", "window": "10m", "key": "{{ order_id }}", "max": 20},
                    {"type": "send", "channel": "inapp", "template_id": "order_shipped"},
                    {"type": "delay", "for": "1h"},
                    {"type": "send", "channels": ["sms", "email"], "template_id": "order_shipped", "if": {"step": 1, "is": "not_read"}}
                ]
            }),
        ),
        ("LinkHostsInput", json!({"hosts": ["shop.example.com", "*.cdn.shop.example.com"]})),
        ("AllowedOriginsInput", json!({"origins": ["https://shop.example.com", "http://localhost:8080"]})),
        ("CreateKey", json!({"role": "tenant", "tenant": "acme", "name": "checkout service"})),
        ("RotateKey", json!({"grace_seconds": 3600})),
        ("Advance", json!({"seconds": 3600})),
        ("FaultConfig", json!({"mode": "fail_5xx", "fail_first_n": 2})),
    ]
}

/// The body rules `tidings-core` checks beyond the types: stock counts and order lines
/// (`inventory`), enums kept as strings in the types (adjustment sources, stock events, the
/// channels of preferences, the events an endpoint subscribes to), IANA zones, link hosts.
fn constrain_bodies(schemas: &mut serde_json::Map<String, serde_json::Value>) {
    use serde_json::json;
    use tidings_core::inventory::MAX_QTY;
    use tidings_core::inventory::model::MAX_HOLD_SECONDS;
    use tidings_core::inventory::stock::MAX_UNITS;
    // `tidings_core::webhooks`: every event type but `webhook.test`, which only the test route sends.
    let subscribable: Vec<serde_json::Value> = schemas
        .get("EventType")
        .and_then(|e| e["enum"].as_array())
        .into_iter()
        .flatten()
        .filter(|e| *e != "webhook.test")
        .cloned()
        .collect();
    fn set(
        schemas: &mut serde_json::Map<String, serde_json::Value>,
        schema: &str,
        property: &str,
        rule: serde_json::Value,
    ) {
        let Some(prop) = schemas.get_mut(schema).and_then(|s| s.pointer_mut(&format!("/properties/{property}"))) else {
            return;
        };
        if let (Some(prop), Some(rule)) = (prop.as_object_mut(), rule.as_object()) {
            prop.extend(rule.clone());
        }
    }
    set(schemas, "WarmUpRequest", "on_hand", json!({"minimum": 0, "maximum": MAX_UNITS}));
    set(schemas, "BatchUser", "tags", json!({"items": id_schema(), "maxItems": 50}));
    set(schemas, "UsersBatch", "users", json!({"maxItems": tidings_core::people::users::MAX_BATCH_USERS}));
    set(
        schemas,
        "AdjustmentRequest",
        "delta",
        json!({"minimum": -MAX_UNITS, "maximum": MAX_UNITS, "not": {"const": 0}}),
    );
    set(
        schemas,
        "AdjustmentRequest",
        "source",
        json!({"enum": ["purchase_order", "return", "transfer", "manual", "damage"]}),
    );
    set(schemas, "OrderRequest", "items", json!({"minItems": 1}));
    // `inventory::locations`: markets ISO 3166-1 alpha-2 upper case, priorities bounded; stock
    // per location as a warm-up's.
    let market = json!({"type": "string", "pattern": "^[A-Z]{2}$"});
    set(schemas, "OrderRequest", "market", json!({"pattern": "^[A-Z]{2}$"}));
    set(
        schemas,
        "LocationRequest",
        "markets",
        json!({"items": market, "uniqueItems": true, "maxItems": tidings_core::inventory::locations::MAX_MARKETS}),
    );
    set(
        schemas,
        "LocationRequest",
        "name",
        json!({"minLength": 1, "maxLength": tidings_core::inventory::locations::MAX_NAME}),
    );
    let range = tidings_core::inventory::locations::PRIORITY_RANGE;
    set(schemas, "LocationRequest", "priority", json!({"minimum": -range, "maximum": range}));
    set(schemas, "LocationStockRequest", "on_hand", json!({"minimum": 0, "maximum": MAX_UNITS}));
    set(schemas, "StockPolicy", "backorder_limit", json!({"minimum": 0, "maximum": MAX_UNITS}));
    set(schemas, "Preorder", "limit", json!({"minimum": 0, "maximum": MAX_UNITS}));
    set(schemas, "Preorder", "until", json!({"format": "date-time"}));
    set(schemas, "LocationStockRequest", "safety_stock", json!({"minimum": 0, "maximum": MAX_UNITS}));
    set(schemas, "AdjustmentRequest", "location_id", id_schema());
    set(schemas, "AdjustmentRequest", "ref", id_schema());
    set(schemas, "IncomingRequest", "qty", json!({"minimum": 1, "maximum": MAX_UNITS}));
    set(schemas, "IncomingRequest", "ref", id_schema());
    set(schemas, "IncomingRequest", "location_id", id_schema());
    set(schemas, "IncomingRequest", "expected_at", json!({"format": "date-time"}));
    set(schemas, "OrderLine", "qty", json!({"minimum": 1, "maximum": MAX_QTY}));
    set(schemas, "StockEvent", "event", json!({"enum": ["stock.in"]}));
    set(schemas, "StockEvent", "qty", json!({"minimum": 1}));
    set(schemas, "OrderRequest", "hold_seconds", json!({"minimum": 1, "maximum": MAX_HOLD_SECONDS}));
    set(schemas, "UserInput", "tags", json!({"items": id_schema(), "maxItems": 50}));
    set(schemas, "NotificationRequest", "channels", json!({"minItems": 1}));
    set(
        schemas,
        "PreferencesInput",
        "categories",
        json!({"propertyNames": {"type": "string", "enum": ["transactional", "marketing"]}}),
    );
    // Params are an object of any values: `additionalProperties: true` said outright, since
    // openapi-typescript reads a bare `type: object` as an object with no keys at all.
    let any_object = json!({"type": "object", "additionalProperties": true});
    set(schemas, "NotificationRequest", "params", any_object.clone());
    set(schemas, "PreviewRequest", "params", any_object);
    let channels = json!({"type": "string", "enum": ["email", "sms", "push", "inapp"]});
    set(schemas, "PreferencesInput", "channels", json!({"propertyNames": channels}));
    // `PreferencesInput::validate`: a workflow's preference is named by the workflow's id, and its
    // per-channel switches by channels.
    set(schemas, "PreferencesInput", "workflows", json!({"propertyNames": id_schema()}));
    if let Some(kinds) =
        schemas.get_mut("WorkflowPreference").and_then(|w| w.get_mut("oneOf")).and_then(|o| o.as_array_mut())
    {
        for kind in kinds.iter_mut().filter(|k| k["type"] == "object") {
            kind["propertyNames"] = channels.clone();
        }
    }
    // `GMT0` and `Etc/GMT0` (aliases of `Etc/GMT`, which the server takes too) are left out:
    // client generators name enum members by letters and digits, and they are `GMT-0`'s and
    // `Etc/GMT-0`'s names there (openapi-python-client refuses the document).
    let zones: Vec<String> = Zone::names().into_iter().filter(|z| !matches!(z.as_str(), "GMT0" | "Etc/GMT0")).collect();
    for schema in ["UserInput", "BatchUser"] {
        set(
            schemas,
            schema,
            "timezone",
            json!({"enum": zones.iter().map(|z| json!(z)).chain([json!(null)]).collect::<Vec<_>>()}),
        );
    }
    set(schemas, "LinkHostsInput", "hosts", json!({"items": {"type": "string", "pattern": LINK_HOST_PATTERN}}));
    set(
        schemas,
        "AllowedOriginsInput",
        "origins",
        json!({"maxItems": tidings_core::site::MAX_ORIGINS, "items": {"type": "string", "pattern": ORIGIN_PATTERN}}),
    );
    set(schemas, "EndpointInput", "events", json!({"items": {"type": "string", "enum": subscribable}}));
    // Repeats are one subscription (the server keeps each type once): no count to exceed.
    if let Some(events) = schemas
        .get_mut("EndpointInput")
        .and_then(|s| s.pointer_mut("/properties/events"))
        .and_then(|e| e.as_object_mut())
    {
        events.remove("maxItems");
    }
    // `UserInput::validate` (`people/users.rs`): a locale is a language tag's characters; a phone
    // is `+` and digits with the separators `e164` skips; an email is one address. Whether a
    // number is in its country's plan, or an address meets every RFC 5322 rule, no pattern says:
    // infra/schemathesis.toml lets that route answer 422 naming the field.
    for schema in ["UserInput", "BatchUser"] {
        set(schemas, schema, "locale", json!({"minLength": 1, "maxLength": 35, "pattern": "^[A-Za-z0-9_-]{1,35}$"}));
        set(
            schemas,
            schema,
            "phone",
            json!({"minLength": 2, "pattern": "^[ ]*[+][0-9 ().-]*[0-9][0-9 ().-]*$", "example": "+14155550100"}),
        );
        set(
            schemas,
            schema,
            "email",
            json!({"format": "email", "minLength": 3, "maxLength": 254, "example": "alice@example.com"}),
        );
    }
    // `PreferencesInput::validate`: transactional messages cannot be turned off (a channel can).
    set(
        schemas,
        "PreferencesInput",
        "categories",
        json!({"properties": {"transactional": {"type": "boolean", "const": true}, "marketing": {"type": "boolean"}}}),
    );
    // `inventory::orders::place_order`: each SKU once per order. JSON Schema cannot say "unique by
    // `sku_id`"; `uniqueItems` states the part it can, and infra/schemathesis.toml the rest.
    set(
        schemas,
        "OrderRequest",
        "items",
        json!({"uniqueItems": true, "maxItems": tidings_core::inventory::orders::MAX_ORDER_SKUS}),
    );
    // `restock::rounds::apply_stock_event`: `skuId` an id (a number is read as its text), `qty`
    // and `source` as an adjustment's, and the upstream's `eventId`, required.
    set(
        schemas,
        "StockEvent",
        "skuId",
        json!({"type": ["string", "number"], "minLength": 1, "maxLength": 128, "pattern": "^[A-Za-z0-9._:@+-]+$"}),
    );
    set(schemas, "StockEvent", "qty", json!({"minimum": 1, "maximum": MAX_UNITS}));
    set(schemas, "StockEvent", "source", json!({"enum": ["purchase_order", "return", "transfer", "manual", "damage"]}));
    if let Some(event) = schemas.get_mut("StockEvent") {
        let description = event.pointer("/properties/eventId/description").cloned();
        event["properties"]["eventId"] = id_schema();
        if let Some(d) = description {
            event["properties"]["eventId"]["description"] = d;
        }
        event["properties"]["tenant"] = json!({
            "type": ["string", "null"],
            "description": "Only on the queue; through the API it must be omitted or be the caller's tenant",
        });
        event["required"] = json!(["event", "skuId", "qty", "source", "eventId"]);
    }
    // Unsigned fields take the whole unsigned range (utoipa writes `int64`/`int32`, whose range
    // ends at the signed maximum).
    set(schemas, "FaultConfig", "retry_after_s", json!({"format": "uint64", "maximum": u64::MAX}));
    set(schemas, "FaultConfig", "fail_first_n", json!({"format": "uint32", "maximum": u32::MAX}));
    // `ops::tenants::check_spec`: a tenant key names its tenant (an id), an operator key none; a
    // name is 1 to 100 printable characters. (`expires_at` in the past is 422 too: no schema
    // knows the time; infra/schemathesis.toml.)
    if let Some(create) = schemas.get_mut("CreateKey") {
        create["properties"]["name"] = json!({"type": ["string", "null"], "minLength": 1, "maxLength": 100, "pattern": "^[^\\x00-\\x1f\\x7f-\\x9f]+$", "description": "What the key is for, for the people who list them."});
        let mut tenant = id_schema();
        tenant["description"] = json!("The tenant of a tenant key (absent for an operator key).");
        tenant["type"] = json!(["string", "null"]);
        create["properties"]["tenant"] = tenant;
        create["if"] = json!({"properties": {"role": {"const": "operator"}}});
        create["then"] = json!({"properties": {"tenant": {"type": "null"}}});
        create["else"] = json!({"required": ["tenant"], "properties": {"tenant": {"type": "string"}}});
    }
    // `NotificationRequest::validate`: the idempotency key's and the requester's rules, exactly
    // one of `user_ids` (1 to 1,000) and `segment`, and `local_time` needs `send_at`.
    set(
        schemas,
        "NotificationRequest",
        "idempotency_key",
        json!({"minLength": 1, "maxLength": 200, "pattern": "^[^#\\x00-\\x1f\\x7f-\\x9f]+$"}),
    );
    if let Some(requester) = schemas.get_mut("Requester").and_then(|r| r.get_mut("properties")) {
        if requester.get("device_id").is_some() {
            requester["device_id"] = json!({"type": ["string", "null"], "minLength": 1, "maxLength": 200, "pattern": "^[^\\x00-\\x1f\\x7f-\\x9f]+$"});
        }
        if requester.get("ip").is_some() {
            requester["ip"] = json!({"type": ["string", "null"], "anyOf": [{"type": "null"}, {"format": "ipv4"}, {"format": "ipv6"}]});
        }
    }
    if let Some(recipients) = schemas.get_mut("Recipients") {
        let ids = json!({"type": "array", "items": id_schema(), "minItems": 1, "maxItems": tidings_core::notify::model::MAX_USER_IDS});
        // Typed branches (`type: object`), which client generators read as two shapes.
        recipients["oneOf"] = json!([
            {"type": "object", "title": "UserIds", "required": ["user_ids"],
             "properties": {"user_ids": ids, "segment": {"type": "null"}}},
            {"type": "object", "title": "Segment", "required": ["segment"],
             "properties": {"segment": id_schema(), "user_ids": {"type": "null"}}},
        ]);
    }
    if let Some(request) = schemas.get_mut("NotificationRequest") {
        request["if"] = json!({"required": ["local_time"], "properties": {"local_time": {"const": true}}});
        request["then"] = json!({"required": ["send_at"], "properties": {"send_at": {"type": "string"}}});
    }
}

/// A host of `PUT /v1/settings/link-hosts` as `tidings_core::tracking` takes it: `shop.example`
/// or `*.shop.example`, any case, blanks around it trimmed; two labels at least, each 1 to 63
/// letters, digits and inner hyphens, the name at most 253 characters; no punycode label (`xn--`)
/// and a last label that is no number (URLs read those as IPv4 addresses).
/// An origin of `PUT /v1/settings/allowed-origins` as `tidings_core::site::parse_origin` takes
/// it: `http` or `https` (any case), host labels, an optional port, an optional trailing `/`.
const ORIGIN_PATTERN: &str = "^[Hh][Tt][Tt][Pp][Ss]?://([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*(:0*(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?/?$";

const LINK_HOST_PATTERN: &str = concat!(
    r"^[ \t\n\r]*(\*\.)?(?=[A-Za-z0-9.-]{1,253}[ \t\n\r]*$)",
    r"((?![xX][nN]--)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+",
    r"(?![xX][nN]--)(?!0[xX][0-9A-Fa-f]*[ \t\n\r]*$)(?=[A-Za-z0-9-]*[A-Za-z])[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?",
    r"[ \t\n\r]*$"
);

/// The document as `tidings openapi` prints it and the committed `openapi.json` holds it.
pub fn document_json() -> serde_json::Result<String> {
    let mut text = serde_json::to_string_pretty(&keys_sorted(document()))?;
    text.push('\n');
    Ok(text)
}

/// The value with every object's keys in byte order. serde_json keeps maps in insertion order
/// when some crate of the build turns on its `preserve_order` feature (a workspace build does,
/// `cargo run -p tidings` alone does not): sorted, the committed file is the same either way.
fn keys_sorted(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<(String, serde_json::Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(entries.into_iter().map(|(k, v)| (k, keys_sorted(v))).collect())
        }
        serde_json::Value::Array(items) => serde_json::Value::Array(items.into_iter().map(keys_sorted).collect()),
        other => other,
    }
}

/// The committed `openapi.json`, gzipped by the build (`build.rs`): what `GET /openapi.json`
/// serves. Only `tidings openapi` builds the document from the handlers' annotations (and
/// writes that file), so the server carries the text, not the code that makes it;
/// `the_committed_openapi_json_is_the_served_document` keeps the two equal.
const DOCUMENT_GZ: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/openapi.json.gz"));

/// The served document, inflated once (for a client that does not take gzip, and the 404's
/// list of routes).
fn document_text() -> Option<&'static [u8]> {
    static PLAIN: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();
    PLAIN.get_or_init(|| inflate(DOCUMENT_GZ).ok()).as_deref()
}

/// The paths of the served document (`/v1/users/{user_id}`, ...).
pub(super) fn served_paths() -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Paths {
        paths: serde_json::Map<String, serde_json::Value>,
    }
    document_text()
        .and_then(|text| serde_json::from_slice::<Paths>(text).ok())
        .map(|d| d.paths.into_iter().map(|(path, _)| path).collect())
        .unwrap_or_default()
}

fn inflate(gzipped: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut plain = Vec::with_capacity(gzipped.len() * 8);
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(gzipped), &mut plain)?;
    Ok(plain)
}

/// `GET /openapi.json`: gzipped to a client that asks for gzip, plain to one that does not ask
/// (tools that read the document seldom inflate an answer they did not ask to be coded).
async fn openapi_json(headers: axum::http::HeaderMap) -> axum::response::Response {
    use axum::http::header;
    use axum::response::IntoResponse;
    let common = [(header::CONTENT_TYPE, "application/json"), (header::VARY, "accept-encoding")];
    if headers.contains_key(header::ACCEPT_ENCODING) && takes_gzip(&headers) {
        return (common, [(header::CONTENT_ENCODING, "gzip")], DOCUMENT_GZ).into_response();
    }
    match document_text() {
        Some(text) => (common, text).into_response(),
        None => unavailable(),
    }
}

fn unavailable() -> axum::response::Response {
    use axum::response::IntoResponse;
    Problem::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, "internal", "the API reference is unavailable")
        .into_response()
}

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(openapi_json))
        .route("/docs", get(docs_page))
        .route("/docs/", get(docs_page))
        .route("/docs/{*file}", get(docs_file))
}

/// The API reference (`GET /docs`, no key): Swagger UI over `/openapi.json`. Its paths are
/// relative to `/docs` (`openapi.json` is `/openapi.json`, `docs/x.js` is `/docs/x.js`), so the
/// page works under a path prefix too (an API Gateway stage).
const DOCS_PAGE: &str = r##"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Tidings API reference</title>
<link rel="stylesheet" href="docs/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="docs/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({ url: "openapi.json", dom_id: "#swagger-ui" });
</script>
</body>
</html>
"##;

async fn docs_page(uri: axum::http::Uri) -> axum::response::Response {
    use axum::response::{Html, IntoResponse, Redirect};
    // Under `/docs/` the relative paths would point one level too deep.
    if uri.path().ends_with('/') {
        return Redirect::permanent("../docs").into_response();
    }
    Html(DOCS_PAGE).into_response()
}

/// Swagger UI's own files (its script and style), gzipped in the binary (`docs-ui/README.md`):
/// answered as they are to a client that takes gzip, inflated for one that does not.
async fn docs_file(
    axum::extract::Path(file): axum::extract::Path<String>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    use axum::http::{StatusCode, header};
    use axum::response::IntoResponse;
    let (gzipped, content_type): (&'static [u8], &str) = match file.as_str() {
        "swagger-ui-bundle.js" => {
            (include_bytes!("../../docs-ui/swagger-ui-bundle.js.gz"), "text/javascript; charset=utf-8")
        }
        "swagger-ui.css" => (include_bytes!("../../docs-ui/swagger-ui.css.gz"), "text/css; charset=utf-8"),
        _ => return Problem::new(StatusCode::NOT_FOUND, "no_route", "no such file of the docs page").into_response(),
    };
    let common = [
        (header::CONTENT_TYPE, content_type),
        (header::VARY, "accept-encoding"),
        (header::CACHE_CONTROL, "public, max-age=86400"),
    ];
    if takes_gzip(&headers) {
        return (common, [(header::CONTENT_ENCODING, "gzip")], gzipped).into_response();
    }
    match inflate(gzipped) {
        Ok(plain) => (common, plain).into_response(),
        Err(_) => unavailable(),
    }
}

/// Whether `Accept-Encoding` takes gzip (RFC 9110 §12.5.3): no header takes any coding; a
/// `gzip`, `x-gzip` or `*` entry takes it unless its weight is 0.
fn takes_gzip(headers: &axum::http::HeaderMap) -> bool {
    let mut values = headers.get_all(axum::http::header::ACCEPT_ENCODING).iter().peekable();
    if values.peek().is_none() {
        return true;
    }
    values.filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(|entry| {
        let mut parts = entry.split(';');
        let coding = parts.next().unwrap_or("").trim();
        let weight_zero = parts.any(|p| {
            let p = p.trim();
            p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")).is_some_and(|q| q.trim().parse::<f32>() == Ok(0.0))
        });
        ["gzip", "x-gzip", "*"].iter().any(|c| coding.eq_ignore_ascii_case(c)) && !weight_zero
    })
}

/// What every operation shares, added once here rather than repeated on each handler: the
/// bearer scheme, and the problem answers any route can give (bad input, a missing key, a
/// write conflict, an unavailable store). A handler's own description of a status wins.
struct Conventions;

/// Statuses any operation can answer, with when.
const ANY_ROUTE: [(&str, &str); 5] = [
    ("400", "Malformed JSON, a wrong type or a bad path/query parameter (`field` names it)"),
    (
        "409",
        "`write_conflict`: other requests wrote the same items at that moment; nothing was written, try again after `Retry-After`",
    ),
    ("422", "Well-formed but invalid (`field` names it)"),
    (
        "429",
        "`rate_limited`: over this tenant's (or, without a key, this address's) rate for the route's class; see `Retry-After`, `RateLimit-Policy` and `RateLimit`",
    ),
    ("503", "The store or a queue is unavailable for now; try again"),
];

impl Modify for Conventions {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(
                Http::builder().scheme(HttpAuthScheme::Bearer).description(Some("A tenant's API key")).build(),
            ),
        );
        components.add_security_scheme(
            "operator_key",
            SecurityScheme::Http(
                Http::builder()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("An operator's API key (`tidings keys create --role operator`)"))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "user_token",
            SecurityScheme::Http(
                Http::builder()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A user token from `POST /v1/users/{user_id}/inbox/token`: it opens that user's `/v1/me` routes and `GET /v1/ws`, nothing else",
                    ))
                    .build(),
            ),
        );
        for (path, item) in doc.paths.paths.iter_mut() {
            if path == "/healthz" {
                continue;
            }
            let ops = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
            for op in ops.into_iter().flatten() {
                if path.starts_with("/dev/") {
                    add_dev_answers(op);
                }
                add_problem_answers(path, op);
            }
        }
        unique_operation_ids(doc);
    }
}

/// utoipa names an operation after its handler, and handlers of different modules share names
/// (`cancel` of notifications, orders and schedules), which breaks client generators: an id
/// is prefixed with its tag (`notifications_cancel`), a stable name per route.
fn unique_operation_ids(doc: &mut Document) {
    for item in doc.paths.paths.values_mut() {
        let ops = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
        for op in ops.into_iter().flatten() {
            let tag = op.tags.as_ref().and_then(|t| t.first()).cloned();
            if let (Some(tag), Some(id)) = (tag, op.operation_id.as_mut())
                && !id.starts_with(&format!("{tag}_"))
            {
                *id = format!("{tag}_{id}");
            }
        }
    }
}

fn problem_response(description: &str) -> RefOr<utoipa::openapi::Response> {
    let content = ContentBuilder::new().schema(Some(RefOr::Ref(Ref::from_schema_name("Problem")))).build();
    RefOr::T(ResponseBuilder::new().description(description).content("application/problem+json", content).build())
}

/// What `/dev` refuses before any key is read (`dev::DevAccess`; docs/operators.md).
fn add_dev_answers(op: &mut Operation) {
    let answers = &mut op.responses.responses;
    answers.entry("421".to_owned()).or_insert_with(|| {
        problem_response(
            "`dev_host_not_loopback`: without a key, `/dev` answers only a `Host` of localhost, 127.0.0.1 or [::1]",
        )
    });
    answers.entry("403".to_owned()).or_insert_with(|| {
        problem_response("`cross_origin_refused`: an `Origin` other than this server's, or `Sec-Fetch-Site` other than same-origin; `operator_only`: a tenant key")
    });
}

fn add_problem_answers(path: &str, op: &mut Operation) {
    let answers = &mut op.responses.responses;
    for (status, description) in ANY_ROUTE {
        answers.entry(status.to_owned()).or_insert_with(|| problem_response(description));
    }
    if path.contains('{') {
        answers.entry("404".to_owned()).or_insert_with(|| {
            problem_response("`not_found`: what the path names does not exist, is another tenant's, or was erased")
        });
    }
    let secured = op.security.as_ref().is_some_and(|s| !s.is_empty());
    if secured && path.starts_with("/v1/me/") {
        answers.entry("401".to_owned()).or_insert_with(|| {
            problem_response("`unauthorized` or `invalid_token`, naming the `Authorization` header: no user token, an expired or forged one, or an API key (which does not open `/v1/me`)")
        });
        answers.entry("403".to_owned()).or_insert_with(|| {
            problem_response("`origin_not_allowed`, naming `Origin`: a page of an origin that is not among the token's tenant's allowed origins (`PUT /v1/settings/allowed-origins`)")
        });
    } else if secured {
        answers.entry("401".to_owned()).or_insert_with(|| {
            problem_response("`unauthorized`, naming the `Authorization` header: none was sent, it is not `Bearer <key>`, or the key is not valid (unknown, revoked or expired)")
        });
        answers.entry("403".to_owned()).or_insert_with(|| {
            problem_response("The key's role may not use this route: a tenant key on an operator route (`operator_only`), an operator key on a tenant's data (`operator_key`)")
        });
    }
    if op.request_body.is_some() {
        answers
            .entry("413".to_owned())
            .or_insert_with(|| problem_response("`body_too_large`: the body is larger than 1 MiB"));
        answers.entry("415".to_owned()).or_insert_with(|| {
            problem_response(
                "`unsupported_media_type`, naming `Content-Type`: the body is not sent as `application/json`",
            )
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::document;

    /// The committed `openapi.json` (what client generators and CI read) is what the server
    /// serves at `GET /openapi.json`.
    #[tokio::test]
    async fn the_committed_openapi_json_is_the_served_document() {
        use axum::body::Body;
        use http_body_util::BodyExt;
        use tower::ServiceExt;

        let state = crate::AppState::of(crate::test_support::memory_deps());
        let req = axum::http::Request::get("/openapi.json").body(Body::empty()).unwrap();
        let res = crate::app(state).oneshot(req).await.unwrap();
        assert_eq!(res.status(), 200);
        let served: serde_json::Value =
            serde_json::from_slice(&res.into_body().collect().await.unwrap().to_bytes()).unwrap();
        assert_eq!(served, serde_json::to_value(document()).unwrap());
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../openapi.json");
        let regenerate = "regenerate it: cargo run -q -p tidings -- openapi > openapi.json";
        let committed = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}; {regenerate}"));
        let committed: serde_json::Value =
            serde_json::from_str(&committed).unwrap_or_else(|e| panic!("{path} is not JSON ({e}); {regenerate}"));
        if committed != served {
            let first = first_difference(&committed, &served, String::new());
            panic!("openapi.json differs from the served document at {first}; {regenerate}");
        }
        assert_eq!(std::fs::read_to_string(path).unwrap(), super::document_json().unwrap(), "formatting; {regenerate}");

        // A client that asks for gzip gets the same document gzipped; one that refuses it, plain.
        for (accept, gzipped) in [("gzip, deflate, br", true), ("identity", false), ("gzip;q=0", false)] {
            let state = crate::AppState::of(crate::test_support::memory_deps());
            let req = axum::http::Request::get("/openapi.json").header("accept-encoding", accept).body(Body::empty());
            let res = crate::app(state).oneshot(req.unwrap()).await.unwrap();
            assert_eq!(res.status(), 200, "{accept}");
            assert_eq!(res.headers().get("content-encoding").is_some(), gzipped, "{accept}");
            assert_eq!(res.headers()["content-type"], "application/json");
            let bytes = res.into_body().collect().await.unwrap().to_bytes();
            let text = if gzipped { super::inflate(&bytes).unwrap() } else { bytes.to_vec() };
            assert_eq!(serde_json::from_slice::<serde_json::Value>(&text).unwrap(), served, "{accept}");
        }
        // The 404's list of routes is the document's.
        let paths = super::served_paths();
        assert_eq!(paths.len(), served["paths"].as_object().unwrap().len());
        assert!(paths.iter().any(|p| p == "/v1/users/{user_id}"), "{paths:?}");
    }

    /// `GET /docs` is the reference page, without a key: HTML that loads the document and
    /// Swagger UI's files from this server (no CDN), and those files are served.
    #[tokio::test]
    async fn the_docs_page_is_served_without_a_key() {
        use axum::body::Body;
        use http_body_util::BodyExt;
        use tower::ServiceExt;

        let state = crate::AppState::of(crate::test_support::memory_deps());
        let app = crate::app(state);
        let get = |uri: &str| axum::http::Request::get(uri).body(Body::empty()).unwrap();
        let res = app.clone().oneshot(get("/docs")).await.unwrap();
        assert_eq!(res.status(), 200);
        assert!(res.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
        let page = String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
        // Relative to `/docs`: `/openapi.json` and `/docs/swagger-ui-bundle.js`.
        assert!(page.contains(r#"url: "openapi.json""#), "{page}");
        assert!(!page.contains("https://"), "nothing from another host: {page}");
        for (file, kind, marker) in [
            ("/docs/swagger-ui-bundle.js", "javascript", "SwaggerUIBundle"),
            ("/docs/swagger-ui.css", "css", ".swagger-ui"),
        ] {
            assert!(page.contains(&file[1..]), "{file} in {page}");
            // A browser takes gzip: the file as it is kept.
            let req = axum::http::Request::get(file).header("accept-encoding", "gzip, deflate, br").body(Body::empty());
            let res = app.clone().oneshot(req.unwrap()).await.unwrap();
            assert_eq!(res.status(), 200, "{file}");
            assert!(res.headers()["content-type"].to_str().unwrap().contains(kind), "{file}");
            assert_eq!(res.headers()["content-encoding"], "gzip", "{file}");
            assert_eq!(res.headers()["vary"], "accept-encoding", "{file}");
            let zipped = res.into_body().collect().await.unwrap().to_bytes();
            let mut inflated = String::new();
            std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&zipped[..]), &mut inflated).unwrap();
            assert!(inflated.contains(marker), "{file}");
            // A client that refuses gzip (or names only identity) gets it inflated.
            for accept in [Some("identity"), Some("gzip;q=0, identity"), Some("br")] {
                let mut req = axum::http::Request::get(file);
                if let Some(a) = accept {
                    req = req.header("accept-encoding", a);
                }
                let res = app.clone().oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
                assert_eq!(res.status(), 200, "{file} {accept:?}");
                assert!(res.headers().get("content-encoding").is_none(), "{file} {accept:?}");
                let body = res.into_body().collect().await.unwrap().to_bytes();
                assert_eq!(body, inflated.as_bytes(), "{file} {accept:?}");
            }
        }
        let res = app.clone().oneshot(get("/openapi.json")).await.unwrap();
        assert_eq!(res.status(), 200);
        let res = app.clone().oneshot(get("/docs/no-such-file.js")).await.unwrap();
        assert_eq!(res.status(), 404);
    }

    #[test]
    fn gzip_is_taken_unless_refused() {
        let with = |values: &[&str]| {
            let mut h = axum::http::HeaderMap::new();
            for v in values {
                h.append("accept-encoding", v.parse().unwrap());
            }
            super::takes_gzip(&h)
        };
        assert!(with(&[]), "no header: any coding");
        assert!(with(&["gzip"]));
        assert!(with(&["br, GZIP;q=0.5"]));
        assert!(with(&["*"]));
        assert!(with(&["identity", "x-gzip"]));
        assert!(!with(&["identity"]));
        assert!(!with(&["gzip;q=0"]));
        assert!(!with(&["gzip; q=0.0, br"]));
        assert!(!with(&["gzipped"]));
    }

    /// What the document lets a client send, the server takes: any hex cursor (a position, not
    /// only a cursor it gave), whole-number floats where integers are asked, an empty time
    /// window; and what it refuses, it refuses naming the field.
    #[tokio::test]
    async fn schema_valid_requests_are_taken_and_the_rest_refused_by_field() {
        use axum::body::Body;
        use axum::http::{Method, Request};
        use http_body_util::BodyExt;
        use serde_json::{Value, json};
        use tidings_core::{TenantId, ops::tenants};
        use tower::ServiceExt;

        let deps = crate::test_support::memory_deps();
        tenants::register_key(&deps, &TenantId::parse("a").unwrap(), "key-a").await.unwrap();
        let state = crate::AppState::of(deps);
        let app = crate::app(state);
        let call = |method: Method, uri: &str, body: Option<Value>| {
            let req = Request::builder()
                .method(method)
                .uri(uri)
                .header("authorization", "Bearer key-a")
                .header("content-type", "application/json")
                .body(Body::from(body.map(|b| b.to_string()).unwrap_or_default()))
                .unwrap();
            let app = app.clone();
            async move {
                let res = app.oneshot(req).await.unwrap();
                let status = res.status().as_u16();
                let bytes = res.into_body().collect().await.unwrap().to_bytes();
                (status, serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null))
            }
        };
        let doc = serde_json::to_value(document()).unwrap();
        let pattern = doc["paths"]["/v1/users"]["get"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "cursor")
            .map(|p| p["schema"]["pattern"].clone())
            .unwrap();
        assert_eq!(pattern, "^([0-9A-Fa-f]{2})*$");
        for cursor in ["", "ff", "00", "7e7e", "C3A9"] {
            for list in ["/v1/users", "/v1/templates", "/v1/users/u1/devices", "/v1/users/u1/inbox"] {
                let (status, body) = call(Method::GET, &format!("{list}?cursor={cursor}"), None).await;
                assert_eq!(status, 200, "{list}?cursor={cursor}: {body}");
            }
        }
        for cursor in ["zz", "abc"] {
            let (status, body) = call(Method::GET, &format!("/v1/users?cursor={cursor}"), None).await;
            assert_eq!((status, &body["field"]), (422, &json!("cursor")), "{cursor}: {body}");
        }
        let (status, body) = call(Method::PUT, "/v1/inventory/s1", Some(json!({"on_hand": 5.0}))).await;
        assert_eq!((status, &body["available"]), (201, &json!(5)), "{body}");
        let (status, body) = call(Method::PUT, "/v1/inventory/s1", Some(json!({"on_hand": 5.5}))).await;
        assert_eq!((status, &body["field"]), (400, &json!("on_hand")), "{body}");
        let (status, body) = call(Method::PUT, "/v1/inventory/s1", Some(json!({"on_hand": -1.0}))).await;
        assert_eq!((status, &body["field"]), (422, &json!("on_hand")), "{body}");
        let window = "/v1/notifications?since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z";
        let (status, body) = call(Method::GET, window, None).await;
        assert_eq!((status, &body["items"]), (200, &json!([])), "{body}");
        let (status, body) = call(Method::PUT, "/v1/settings/link-hosts", Some(json!({"hosts": ["a.1"]}))).await;
        assert_eq!((status, &body["field"]), (422, &json!("hosts[0]")), "{body}");
    }

    /// The JSON pointer of the first place where `a` and `b` differ.
    fn first_difference(a: &serde_json::Value, b: &serde_json::Value, at: String) -> String {
        use serde_json::Value::{Array, Object};
        match (a, b) {
            (Object(x), Object(y)) => {
                for key in x.keys().chain(y.keys()) {
                    let here = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
                    match (x.get(key), y.get(key)) {
                        (Some(p), Some(q)) if p == q => {}
                        (Some(p), Some(q)) => return first_difference(p, q, here),
                        (None, _) => return format!("{here} (only served)"),
                        (_, None) => return format!("{here} (only in the file)"),
                    }
                }
                at
            }
            (Array(x), Array(y)) if x.len() == y.len() => {
                for (i, (p, q)) in x.iter().zip(y).enumerate() {
                    if p != q {
                        return first_difference(p, q, format!("{at}/{i}"));
                    }
                }
                at
            }
            _ => at,
        }
    }

    /// `(METHOD, path)` of every `.route(...)` in the route modules' sources.
    fn routes_in_source() -> Vec<(String, String)> {
        let sources = [
            include_str!("users.rs"),
            include_str!("preferences.rs"),
            include_str!("devices.rs"),
            include_str!("callbacks.rs"),
            include_str!("tracking.rs"),
            include_str!("templates.rs"),
            include_str!("notifications.rs"),
            include_str!("inbox.rs"),
            include_str!("live.rs"),
            include_str!("inventory.rs"),
            include_str!("restock.rs"),
            include_str!("ops.rs"),
            include_str!("admin.rs"),
            include_str!("dev.rs"),
        ];
        let mut out = Vec::new();
        for src in sources {
            for part in src.split(".route(\"").skip(1) {
                let (path, rest) = part.split_once('"').unwrap();
                // The methods are in this call: up to its closing parenthesis, then chained
                // `.get(...)` calls until the next `.route(`.
                let mut depth = 1;
                let end = rest
                    .char_indices()
                    .find(|&(_, c)| {
                        depth += match c {
                            '(' => 1,
                            ')' => -1,
                            _ => 0,
                        };
                        depth == 0
                    })
                    .map_or(rest.len(), |(i, _)| i);
                let call = &rest[..end];
                for method in ["get", "put", "post", "delete", "patch"] {
                    let found = [format!(" {method}("), format!("({method}("), format!(".{method}(")]
                        .iter()
                        .any(|m| call.contains(m.as_str()));
                    if found {
                        out.push((method.to_owned(), path.to_owned()));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn operation_ids_are_unique() {
        let doc = serde_json::to_value(document()).unwrap();
        let mut seen = std::collections::BTreeMap::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let Some(id) = op["operationId"].as_str() else { continue };
                if let Some(other) = seen.insert(id.to_owned(), format!("{method} {path}")) {
                    panic!("operationId {id} twice: {other} and {method} {path}");
                }
            }
        }
        assert!(seen.contains_key("notifications_cancel"), "{seen:?}");
    }

    #[test]
    fn every_route_is_documented() {
        let doc = serde_json::to_value(document()).unwrap();
        let routes = routes_in_source();
        assert!(routes.len() > 40, "{routes:?}");
        let mut missing = Vec::new();
        for (method, path) in routes {
            if path == "/" {
                continue; // the console page
            }
            if doc["paths"][&path][&method].is_null() {
                missing.push(format!("{} {path}", method.to_uppercase()));
            }
        }
        assert!(missing.is_empty(), "not in /openapi.json: {missing:#?}");
    }

    #[test]
    fn v1_operations_need_the_key_and_answer_problems() {
        let doc = serde_json::to_value(document()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        assert_eq!(doc["components"]["securitySchemes"]["api_key"]["scheme"], "bearer");
        let problem = &doc["components"]["schemas"]["Problem"];
        assert!(problem["properties"]["type"].is_object() && problem["properties"]["code"].is_object(), "{problem}");
        let get_user = &doc["paths"]["/v1/users/{user_id}"]["get"];
        assert_eq!(get_user["security"][0]["api_key"], serde_json::json!([]));
        for status in ["200", "400", "401", "404", "422"] {
            assert!(get_user["responses"][status].is_object(), "{status}: {get_user}");
        }
        assert!(
            get_user["responses"]["404"]["content"]["application/problem+json"]["schema"]["$ref"]
                .as_str()
                .is_some_and(|r| r.ends_with("/Problem")),
            "{get_user}"
        );
        assert!(doc["paths"]["/dev/clock/advance"]["post"]["tags"][0] == "dev");
        // `/dev` shows every tenant's sends: an operator's key, never a tenant's.
        for (path, item) in doc["paths"].as_object().unwrap().iter().filter(|(p, _)| p.starts_with("/dev/")) {
            for (method, op) in item.as_object().unwrap() {
                assert_eq!(op["security"], serde_json::json!([{"operator_key": []}]), "{method} {path}");
                assert!(op["responses"]["421"].is_object(), "{method} {path} states the Host rule");
            }
        }
        assert_eq!(doc["paths"]["/healthz"]["get"]["security"], serde_json::json!([]), "public: no key");
        assert_eq!(doc["paths"]["/v1/callbacks/{provider}"]["post"]["security"], serde_json::json!([]));
    }

    /// A template body's locale keys are stated as `tidings_core::templates::is_locale_key`
    /// checks them, and its example is a template the server saves.
    #[test]
    fn the_template_body_states_its_locale_rules() {
        let doc = serde_json::to_value(document()).unwrap();
        let input = &doc["components"]["schemas"]["TemplateInput"];
        assert_eq!(input["properties"]["locales"]["minProperties"], 1);
        let pattern = input["properties"]["locales"]["propertyNames"]["pattern"].as_str().unwrap();
        assert_eq!(pattern, input["properties"]["default_locale"]["pattern"].as_str().unwrap());
        assert_eq!(pattern, "^[A-Za-z0-9_-]{1,35}$");
        // What that pattern matches, and what it does not, is what the server takes.
        for key in ["en", "zh-CN", "en_GB", &"x".repeat(35)] {
            assert!(tidings_core::templates::is_locale_key(key), "{key:?}");
        }
        for key in ["", "e n", &"x".repeat(36), "é", "en.GB"] {
            assert!(!tidings_core::templates::is_locale_key(key), "{key:?}");
        }
        let example: tidings_core::templates::TemplateInput = serde_json::from_value(input["example"].clone()).unwrap();
        assert!(example.locales.contains_key(&example.default_locale));
    }
}
