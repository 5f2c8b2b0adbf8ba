//! Inventory and orders; the rules live in `tidings_core::inventory` (docs/inventory.md).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use axum::{Json, Router};
use tidings_core::inventory::{
    self, AdjustmentRequest, Finding, FindingPage, FindingStatus, Incoming, IncomingRequest, LedgerPage, Location,
    LocationList, LocationRequest, LocationStockRequest, OrderRequest, OrderView, ReconcileReport, SettleRequest,
    StockPolicy, StockView, WarmUpRequest,
};

use crate::extract::{Body, IdempotencyKey, Operator, PageParams, PathParams, QueryParams, Tenant};
use crate::problem::{ApiResult, Problem};
use crate::state::AppState;

#[derive(utoipa::OpenApi)]
#[openapi(paths(
    put_location,
    list_locations,
    put_location_stock,
    warm_up,
    show_stock,
    put_policy,
    adjust,
    expect_incoming,
    ledger,
    place_order,
    show_order,
    pay,
    cancel,
    reconcile,
    list_findings,
    settle_finding
))]
pub(super) struct Api;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/locations", get(list_locations))
        .route("/v1/locations/{location_id}", put(put_location))
        .route("/v1/inventory/{sku_id}", put(warm_up).get(show_stock))
        .route("/v1/inventory/{sku_id}/locations/{location_id}", put(put_location_stock))
        .route("/v1/inventory/{sku_id}/policy", put(put_policy))
        .route("/v1/inventory/{sku_id}/adjustments", post(adjust))
        .route("/v1/inventory/{sku_id}/incoming", post(expect_incoming))
        .route("/v1/inventory/{sku_id}/ledger", get(ledger))
        .route("/v1/orders", post(place_order))
        .route("/v1/orders/{order_id}", get(show_order))
        .route("/v1/orders/{order_id}/pay", post(pay))
        .route("/v1/orders/{order_id}/cancel", post(cancel))
        .route("/v1/ops/reconcile", post(reconcile))
        .route("/v1/ops/inventory-findings", get(list_findings))
        .route("/v1/ops/inventory-findings/{id}/settle", post(settle_finding))
}

/// Creates (201) or replaces (200) a location: the markets it serves and its priority (lower is
/// held from first). A shop that never defines `default` has it, serving every market, first.
#[utoipa::path(put, path = "/v1/locations/{location_id}", tag = "inventory", security(("api_key" = [])),
    params(("location_id" = String, Path, description = "The location id")), request_body = LocationRequest,
    responses((status = 201, description = "New location", body = Location), (status = 200, description = "The location, replaced", body = Location),
        (status = 422, description = "A bad `name`, `markets[i]` or `priority`, or too many locations", body = Problem, content_type = "application/problem+json")))]
async fn put_location(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(location_id): PathParams<String>,
    Body(req): Body<LocationRequest>,
) -> ApiResult<(StatusCode, Json<Location>)> {
    let (location, created) = inventory::locations::put(&s.deps, &t, &location_id, &req).await?;
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(location)))
}

/// The shop's locations, `default` first, then by priority.
#[utoipa::path(get, path = "/v1/locations", tag = "inventory", security(("api_key" = [])),
    responses((status = 200, description = "Every location", body = LocationList)))]
async fn list_locations(State(s): State<AppState>, Tenant(t): Tenant) -> ApiResult<Json<LocationList>> {
    Ok(Json(LocationList { items: inventory::locations::all(&s.deps, &t).await? }))
}

/// A SKU's stock at a location: 201 when the location's cell is new (with `on_hand`, of which
/// `safety_stock` is kept back); 200 when it exists: its stock unchanged (adjustments move it),
/// its safety stock set when given.
#[utoipa::path(put, path = "/v1/inventory/{sku_id}/locations/{location_id}", tag = "inventory", security(("api_key" = [])),
    params(("sku_id" = String, Path, description = "The SKU id"), ("location_id" = String, Path, description = "The location id")),
    request_body = LocationStockRequest,
    responses((status = 201, description = "New stock at the location", body = StockView), (status = 200, description = "The stock (safety stock set when given)", body = StockView),
        (status = 404, description = "No such location", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`insufficient_stock`: fewer units available than the safety stock keeps back", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A bad `on_hand` or `safety_stock`", body = Problem, content_type = "application/problem+json")))]
async fn put_location_stock(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams((sku_id, location_id)): PathParams<(String, String)>,
    Body(req): Body<LocationStockRequest>,
) -> ApiResult<(StatusCode, Json<StockView>)> {
    let (view, created) = inventory::put_location_stock(&s.deps, &t, &sku_id, &location_id, &req).await?;
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(view)))
}

/// 201 when the SKU is new; 200 with the stock unchanged when it exists.
#[utoipa::path(put, path = "/v1/inventory/{sku_id}", tag = "inventory", security(("api_key" = [])),
    params(("sku_id" = String, Path, description = "The SKU id")), request_body = WarmUpRequest,
    responses((status = 201, description = "New SKU", body = StockView), (status = 200, description = "The SKU existed; unchanged", body = StockView)))]
async fn warm_up(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(sku_id): PathParams<String>,
    Body(req): Body<WarmUpRequest>,
) -> ApiResult<(StatusCode, Json<StockView>)> {
    let (view, created) = inventory::warm_up(&s.deps, &t, &sku_id, &req).await?;
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, Json(view)))
}

#[utoipa::path(get, path = "/v1/inventory/{sku_id}", tag = "inventory", security(("api_key" = [])),
    params(("sku_id" = String, Path, description = "The SKU id")),
    responses((status = 200, description = "The stock", body = StockView), (status = 404, description = "No such SKU", body = Problem, content_type = "application/problem+json")))]
async fn show_stock(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(sku_id): PathParams<String>,
) -> ApiResult<Json<StockView>> {
    inventory::get_stock(&s.deps, &t, &sku_id).await?.map(Json).ok_or_else(|| Problem::not_found("sku").into())
}

/// The SKU's backorder and pre-order policy, set whole (an absent field clears it): orders past
/// the stock, up to the limit, are BACKORDERED (PREORDERED while the window is open) and are
/// filled oldest first as stock arrives, before any back-in-stock alert for those units.
#[utoipa::path(put, path = "/v1/inventory/{sku_id}/policy", tag = "inventory", security(("api_key" = [])),
    params(("sku_id" = String, Path, description = "The SKU id")), request_body = StockPolicy,
    responses((status = 200, description = "The stock, with its policy", body = StockView),
        (status = 404, description = "No such SKU", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A bad `backorder_limit`, `preorder.limit` or `preorder.until` (a future RFC 3339 time)", body = Problem, content_type = "application/problem+json")))]
async fn put_policy(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(sku_id): PathParams<String>,
    Body(req): Body<StockPolicy>,
) -> ApiResult<Json<StockView>> {
    Ok(Json(inventory::put_policy(&s.deps, &t, &sku_id, &req).await?))
}

#[utoipa::path(post, path = "/v1/inventory/{sku_id}/adjustments", tag = "inventory", security(("api_key" = [])),
    params(("sku_id" = String, Path, description = "The SKU id"),
        ("Idempotency-Key" = Option<String>, Header, description = "The body's `idempotency_key` as a header (either, or both the same; 422 when they differ)")),
    request_body = AdjustmentRequest,
    responses((status = 200, description = "The stock after the adjustment", body = StockView), (status = 404, description = "No such SKU", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`insufficient_stock`, or the idempotency key was used with another body", body = Problem, content_type = "application/problem+json")))]
async fn adjust(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(sku_id): PathParams<String>,
    header: IdempotencyKey,
    Body(mut req): Body<AdjustmentRequest>,
) -> ApiResult<Json<StockView>> {
    let body = Some(std::mem::take(&mut req.idempotency_key)).filter(|k| !k.is_empty());
    req.idempotency_key = header.merge(body)?.unwrap_or_default();
    Ok(Json(inventory::adjust(&s.deps, &t, &sku_id, &req).await?))
}

/// Stock on its way: 201 for a new shipment (its `ref`), 200 for the same one again (unchanged,
/// or its date or quantity updated while it is on its way). Subscribers who asked hear the date.
#[utoipa::path(post, path = "/v1/inventory/{sku_id}/incoming", tag = "inventory", security(("api_key" = [])),
    params(("sku_id" = String, Path, description = "The SKU id")), request_body = IncomingRequest,
    responses((status = 201, description = "A new shipment on its way", body = Incoming),
        (status = 200, description = "The same shipment: unchanged, or its date or quantity updated", body = Incoming),
        (status = 404, description = "No such SKU", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`incoming_received`: that shipment has arrived already", body = Problem, content_type = "application/problem+json")))]
async fn expect_incoming(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(sku_id): PathParams<String>,
    Body(req): Body<IncomingRequest>,
) -> ApiResult<(StatusCode, Json<Incoming>)> {
    let (incoming, recorded) = inventory::incoming::expect(&s.deps, &t, &sku_id, &req).await?;
    let status = if recorded == inventory::incoming::Recorded::Created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(incoming)))
}

#[utoipa::path(get, path = "/v1/inventory/{sku_id}/ledger", tag = "inventory", security(("api_key" = [])),
    params(("sku_id" = String, Path, description = "The SKU id"), PageParams),
    responses((status = 200, description = "Ledger entries, oldest first", body = LedgerPage), (status = 404, description = "No such SKU", body = Problem, content_type = "application/problem+json")))]
async fn ledger(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(sku_id): PathParams<String>,
    QueryParams(page): QueryParams<PageParams>,
) -> ApiResult<Json<LedgerPage>> {
    inventory::ledger(&s.deps, &t, &sku_id, page.limit()?, page.cursor)
        .await?
        .map(Json)
        .ok_or_else(|| Problem::not_found("sku").into())
}

/// 201 PENDING with `expires_at`; 200 when the same order was placed before.
#[utoipa::path(post, path = "/v1/orders", tag = "inventory", security(("api_key" = [])),
    request_body = OrderRequest,
    responses((status = 201, description = "PENDING, stock held until `expires_at`", body = OrderView),
        (status = 200, description = "The same order placed before", body = OrderView),
        (status = 404, description = "An unknown SKU", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`insufficient_stock` naming the SKU (nothing held), or the order id was used with another body", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad input naming the field; `items` when the order cannot be one transaction (too many SKUs, shards or locations)", body = Problem, content_type = "application/problem+json")))]
async fn place_order(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    Body(req): Body<OrderRequest>,
) -> ApiResult<(StatusCode, Json<OrderView>)> {
    let placed = inventory::place_order(&s.deps, &t, &req).await?;
    Ok((if placed.created { StatusCode::CREATED } else { StatusCode::OK }, Json(placed.order)))
}

#[utoipa::path(get, path = "/v1/orders/{order_id}", tag = "inventory", security(("api_key" = [])),
    params(("order_id" = String, Path, description = "The order id")),
    responses((status = 200, description = "The order", body = OrderView), (status = 404, description = "No such order", body = Problem, content_type = "application/problem+json")))]
async fn show_order(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(order_id): PathParams<String>,
) -> ApiResult<Json<OrderView>> {
    inventory::get_order(&s.deps, &t, &order_id).await?.map(Json).ok_or_else(|| Problem::not_found("order").into())
}

#[utoipa::path(post, path = "/v1/orders/{order_id}/pay", tag = "inventory", security(("api_key" = [])),
    params(("order_id" = String, Path, description = "The order id")),
    responses((status = 200, description = "PAID", body = OrderView), (status = 404, description = "No such order", body = Problem, content_type = "application/problem+json"), (status = 409, description = "`invalid_state`: not allowed in the order's status", body = Problem, content_type = "application/problem+json")))]
async fn pay(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(order_id): PathParams<String>,
) -> ApiResult<Json<OrderView>> {
    Ok(Json(inventory::pay(&s.deps, &t, &order_id).await?))
}

#[utoipa::path(post, path = "/v1/orders/{order_id}/cancel", tag = "inventory", security(("api_key" = [])),
    params(("order_id" = String, Path, description = "The order id")),
    responses((status = 200, description = "CANCELLED, the hold released", body = OrderView), (status = 404, description = "No such order", body = Problem, content_type = "application/problem+json"), (status = 409, description = "`invalid_state`: not allowed in the order's status", body = Problem, content_type = "application/problem+json")))]
async fn cancel(
    State(s): State<AppState>,
    Tenant(t): Tenant,
    PathParams(order_id): PathParams<String>,
) -> ApiResult<Json<OrderView>> {
    Ok(Json(inventory::cancel(&s.deps, &t, &order_id).await?))
}

/// Reconciles the caller's SKUs now (the daily schedule reconciles every tenant's).
#[utoipa::path(post, path = "/v1/ops/reconcile", tag = "ops", security(("api_key" = [])),
    responses((status = 200, description = "Counters compared with the ledger", body = ReconcileReport)))]
async fn reconcile(State(s): State<AppState>, Tenant(t): Tenant) -> ApiResult<Json<ReconcileReport>> {
    Ok(Json(inventory::reconcile(&s.deps, Some(&t)).await?))
}

#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct FindingQuery {
    /// `open` (the default: what waits for a person) or `settled`.
    status: Option<String>,
    /// Items per page, 1 to 500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<usize>,
    /// The `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// Every tenant's reconciliation findings in one status, oldest first (an operator key: the
/// findings are the operators' work, docs/inventory.md, "Findings").
#[utoipa::path(get, path = "/v1/ops/inventory-findings", tag = "ops", security(("operator_key" = [])), params(FindingQuery),
    responses((status = 200, description = "One page of findings", body = FindingPage),
        (status = 403, description = "`operator_only`: a tenant's key", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A bad `status`, `limit` or `cursor`", body = Problem, content_type = "application/problem+json")))]
async fn list_findings(
    State(s): State<AppState>,
    _op: Operator,
    QueryParams(q): QueryParams<FindingQuery>,
) -> ApiResult<Json<FindingPage>> {
    let limit = PageParams { limit: q.limit, cursor: None }.limit()?;
    let status = FindingStatus::parse(q.status.as_deref().unwrap_or("open"))?;
    Ok(Json(inventory::findings::list(&s.deps, status, limit, q.cursor).await?))
}

/// Settles an open finding with a reason: `corrective_entry` writes one ledger entry (kind
/// `correction`, no counter moves) that makes the ledger agree with the counters; `accepted`
/// records the decision, and the same difference is not reported as a finding again.
#[utoipa::path(post, path = "/v1/ops/inventory-findings/{id}/settle", tag = "ops", security(("operator_key" = [])),
    params(("id" = String, Path, description = "The finding's id")), request_body = SettleRequest,
    responses((status = 200, description = "The settled finding", body = Finding),
        (status = 403, description = "`operator_only`: a tenant's key", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such finding", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`already_settled`; `finding_changed`: the cell no longer differs by the finding's difference (run the reconciliation again)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "No `reason`, or a bad `kind`", body = Problem, content_type = "application/problem+json")))]
async fn settle_finding(
    State(s): State<AppState>,
    op: Operator,
    PathParams(id): PathParams<String>,
    Body(req): Body<SettleRequest>,
) -> ApiResult<Json<Finding>> {
    Ok(Json(inventory::findings::settle(&s.deps, &id, &req, &op.key_id).await?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use axum::body::Body as HttpBody;
    use axum::http::{Method, Request};
    use http_body_util::BodyExt;
    use serde_json::{Value, json};
    use tidings_core::timers::TIMERS_QUEUE;
    use tidings_core::{TenantId, ops::tenants};
    use tidings_embedded::{EmbeddedStore, QueueConfig};
    use tower::ServiceExt;

    use crate::state::AppState;

    async fn app() -> axum::Router {
        let store = EmbeddedStore::in_memory().unwrap();
        store.declare_queue(QueueConfig::new(TIMERS_QUEUE, 5)).unwrap();
        let deps = crate::test_support::deps_over(store);
        tenants::register_key(&deps, &TenantId::parse("a").unwrap(), "key-a").await.unwrap();
        tenants::register_key(&deps, &TenantId::parse("b").unwrap(), "key-b").await.unwrap();
        crate::app(AppState::of(deps))
    }

    async fn call(app: &axum::Router, key: &str, method: Method, uri: &str, body: Option<&str>) -> (u16, Value) {
        crate::test_support::call_json(app, key, method, uri, body.unwrap_or("").to_owned()).await
    }

    #[tokio::test]
    async fn warm_up_is_201_then_200_unchanged() {
        let app = app().await;
        let (status, body) = call(&app, "key-a", Method::PUT, "/v1/inventory/1001", Some(r#"{"on_hand": 5}"#)).await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(
            body,
            json!({"sku_id": "1001", "available": 5, "reserved": 0, "sold": 0, "restock_round": 0, "shards": 1})
        );
        let (status, body) = call(&app, "key-a", Method::PUT, "/v1/inventory/1001", Some(r#"{"on_hand": 50}"#)).await;
        assert_eq!(status, 200);
        assert_eq!(body["available"], 5);
        let (status, body) = call(&app, "key-a", Method::GET, "/v1/inventory/1001/ledger?limit=10", None).await;
        assert_eq!(status, 200);
        assert_eq!(body["items"][0]["kind"], "warm_up");
        assert_eq!(body["items"][0]["delta_available"], 5);
        assert!(
            body["items"][0]["ref"].is_string()
                && body["items"][0]["at"].is_string()
                && body["items"][0]["entry_id"].is_string()
        );
        let (status, _) = call(&app, "key-b", Method::GET, "/v1/inventory/1001", None).await;
        assert_eq!(status, 404, "another tenant's SKU");
    }

    /// A policy is an object: an array (which serde would read as one, every field absent) is
    /// 400 and clears nothing; a bad field is named.
    #[tokio::test]
    async fn a_policy_body_must_be_an_object() {
        let app = app().await;
        call(&app, "key-a", Method::PUT, "/v1/inventory/p", Some(r#"{"on_hand": 1}"#)).await;
        let (status, body) =
            call(&app, "key-a", Method::PUT, "/v1/inventory/p/policy", Some(r#"{"backorder_limit": 4}"#)).await;
        assert_eq!((status, &body["policy"]["backorder_limit"]), (200, &json!(4)), "{body}");
        let (status, body) = call(&app, "key-a", Method::PUT, "/v1/inventory/p/policy", Some("[null, null]")).await;
        assert_eq!(status, 400, "{body}");
        let (status, body) =
            call(&app, "key-a", Method::PUT, "/v1/inventory/p/policy", Some(r#"{"backorder_limit": "x"}"#)).await;
        assert_eq!((status, body["field"].as_str()), (400, Some("backorder_limit")), "{body}");
        let (_, body) = call(&app, "key-a", Method::GET, "/v1/inventory/p", None).await;
        assert_eq!(body["policy"]["backorder_limit"], 4, "still set: {body}");
    }

    #[tokio::test]
    async fn orders_answer_as_the_contract_says() {
        let app = app().await;
        call(&app, "key-a", Method::PUT, "/v1/inventory/1001", Some(r#"{"on_hand": 2}"#)).await;
        call(&app, "key-a", Method::PUT, "/v1/inventory/1002", Some(r#"{"on_hand": 9}"#)).await;
        let order = r#"{"order_id": "o1", "user_id": "u1", "items": [{"sku_id": "1002", "qty": 1}, {"sku_id": "1001", "qty": 3}]}"#;
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/orders", Some(order)).await;
        assert_eq!(status, 409, "{body}");
        assert_eq!(body["code"], "insufficient_stock");
        assert!(body["detail"].as_str().unwrap().contains("1001"), "{body}");
        let (_, stock) = call(&app, "key-a", Method::GET, "/v1/inventory/1002", None).await;
        assert_eq!(stock["reserved"], 0, "nothing held");

        let order =
            r#"{"order_id": "o1", "user_id": "u1", "items": [{"sku_id": "1001", "qty": 2}], "hold_seconds": 120}"#;
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/orders", Some(order)).await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["status"], "PENDING");
        assert!(body["expires_at"].is_string());
        let (status, _) = call(&app, "key-a", Method::POST, "/v1/orders", Some(order)).await;
        assert_eq!(status, 200, "the same order again");
        let (status, _) = call(&app, "key-b", Method::GET, "/v1/orders/o1", None).await;
        assert_eq!(status, 404, "another tenant's order");
        let (status, _) = call(&app, "key-b", Method::POST, "/v1/orders/o1/cancel", None).await;
        assert_eq!(status, 404);
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/orders/o1/pay", None).await;
        assert_eq!((status, body["status"].clone()), (200, json!("PAID")));
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/orders/o1/cancel", None).await;
        assert_eq!((status, body["code"].clone()), (409, json!("invalid_state")));
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/orders/o1/pay", None).await;
        assert_eq!((status, body["code"].clone()), (409, json!("invalid_state")));
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/ops/reconcile", Some("")).await;
        assert_eq!(status, 200);
        assert_eq!(body["checked"], 2);
        assert_eq!(body["discrepancies"], json!([]));
    }

    /// Locations, stock per location, adjustments at one, and orders for a market, as
    /// docs/inventory.md says ("Locations and markets").
    #[tokio::test]
    async fn locations_and_markets_answer_as_the_contract_says() {
        let app = app().await;
        let east = r#"{"name": "East", "markets": ["US", "CA"], "priority": 1}"#;
        let (status, body) = call(&app, "key-a", Method::PUT, "/v1/locations/east", Some(east)).await;
        assert_eq!((status, &body["markets"]), (201, &json!(["US", "CA"])), "{body}");
        let (status, _) = call(&app, "key-a", Method::PUT, "/v1/locations/east", Some(east)).await;
        assert_eq!(status, 200, "replaced");
        let west = r#"{"name": "West", "markets": ["US"], "priority": 2}"#;
        call(&app, "key-a", Method::PUT, "/v1/locations/west", Some(west)).await;
        for (body, field) in [
            (r#"{"name": "X", "markets": ["usa"], "priority": 1}"#, "markets[0]"),
            (r#"{"name": "", "markets": [], "priority": 1}"#, "name"),
            (r#"{"name": "X", "markets": [], "priority": 99999999}"#, "priority"),
        ] {
            let (status, v) = call(&app, "key-a", Method::PUT, "/v1/locations/bad", Some(body)).await;
            assert_eq!((status, v["field"].as_str()), (422, Some(field)), "{body}: {v}");
        }
        let (status, list) = call(&app, "key-a", Method::GET, "/v1/locations", None).await;
        assert_eq!(status, 200);
        let ids: Vec<&str> =
            list["items"].as_array().unwrap().iter().filter_map(|l| l["location_id"].as_str()).collect();
        assert_eq!(ids, ["default", "east", "west"]);
        let (_, other) = call(&app, "key-b", Method::GET, "/v1/locations", None).await;
        assert_eq!(other["items"].as_array().map(Vec::len), Some(1), "another tenant's: only its default");

        let stock = r#"{"on_hand": 5, "safety_stock": 1}"#;
        let (status, body) = call(&app, "key-a", Method::PUT, "/v1/inventory/1001/locations/east", Some(stock)).await;
        assert_eq!(status, 201, "{body}");
        assert_eq!((&body["available"], &body["safety_stock"]), (&json!(4), &json!(1)), "{body}");
        let (status, body) = call(&app, "key-b", Method::PUT, "/v1/inventory/1001/locations/east", Some(stock)).await;
        assert_eq!((status, body["field"].as_str()), (404, Some("location_id")), "another tenant's location");
        let adj = r#"{"delta": 3, "source": "purchase_order", "idempotency_key": "k1", "location_id": "west"}"#;
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/inventory/1001/adjustments", Some(adj)).await;
        assert_eq!((status, body["field"].as_str()), (404, Some("location_id")), "west holds no cell yet: {body}");
        let (status, _) =
            call(&app, "key-a", Method::PUT, "/v1/inventory/1001/locations/west", Some(r#"{"on_hand": 0}"#)).await;
        assert_eq!(status, 201);
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/inventory/1001/adjustments", Some(adj)).await;
        assert_eq!(status, 200, "{body}");
        let locations: Vec<(String, i64)> = body["locations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| (l["location_id"].as_str().unwrap().to_owned(), l["available"].as_i64().unwrap()))
            .collect();
        assert_eq!(locations, [("default".into(), 0), ("east".into(), 4), ("west".into(), 3)]);

        let order = r#"{"order_id": "o1", "user_id": "u1", "items": [{"sku_id": "1001", "qty": 6}], "market": "US"}"#;
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/orders", Some(order)).await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(
            body["items"][0]["allocations"],
            json!([{"location_id": "east", "qty": 4}, {"location_id": "west", "qty": 2}]),
            "{body}"
        );
        let (_, shown) = call(&app, "key-a", Method::GET, "/v1/orders/o1", None).await;
        assert_eq!((&shown["market"], &shown["items"]), (&json!("US"), &body["items"]));
        let order = r#"{"order_id": "o2", "user_id": "u1", "items": [{"sku_id": "1001", "qty": 2}], "market": "CA"}"#;
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/orders", Some(order)).await;
        assert_eq!((status, &body["code"]), (409, &json!("insufficient_stock")), "CA is served by east only: {body}");
        let order = r#"{"order_id": "o3", "user_id": "u1", "items": [{"sku_id": "1001", "qty": 1}], "market": "u"}"#;
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/orders", Some(order)).await;
        assert_eq!((status, body["field"].as_str()), (422, Some("market")), "{body}");
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/ops/reconcile", Some("")).await;
        assert_eq!((status, &body["discrepancies"]), (200, &json!([])), "{body}");
    }

    /// A finding is one record however often a run sees it; only an operator lists or settles it,
    /// with a reason, once; a corrective entry moves the ledger alone, and the next run finds
    /// nothing.
    #[tokio::test]
    async fn findings_are_listed_and_settled_once_by_operators_only() {
        use tidings_core::inventory::REVIEW_QUEUE;
        use tidings_core::ops::tenants::{KeySpec, Role};
        use tidings_core::ports::{Cond, Key, Update};
        let store = EmbeddedStore::in_memory().unwrap();
        for q in [TIMERS_QUEUE, REVIEW_QUEUE] {
            store.declare_queue(QueueConfig::new(q, 5)).unwrap();
        }
        let deps = crate::test_support::deps_over(store);
        tenants::register_key(&deps, &TenantId::parse("a").unwrap(), "key-a").await.unwrap();
        tenants::register(&deps, "key-ops", KeySpec { role: Role::Operator, ..Default::default() }).await.unwrap();
        let app = crate::app(AppState::of(deps.clone()));
        call(&app, "key-a", Method::PUT, "/v1/inventory/1001", Some(r#"{"on_hand": 5}"#)).await;
        // A counter moved behind the ledger's back (a lost ledger write, say).
        let stock = Key::new("T#a#SKU#1001", "STOCK");
        deps.table.update(&stock, vec![Update::add("available", 2)], Cond::Exists).await.unwrap();

        let (_, first) = call(&app, "key-a", Method::POST, "/v1/ops/reconcile", Some("")).await;
        let (_, second) = call(&app, "key-a", Method::POST, "/v1/ops/reconcile", Some("")).await;
        assert_eq!((first["opened"].as_u64(), second["opened"].as_u64()), (Some(1), Some(0)), "{first} {second}");
        let id = first["discrepancies"][0]["finding_id"].as_str().unwrap().to_owned();
        assert_eq!(second["discrepancies"][0]["finding_id"], json!(id), "{second}");

        for (method, uri) in [
            (Method::GET, "/v1/ops/inventory-findings".to_owned()),
            (Method::POST, format!("/v1/ops/inventory-findings/{id}/settle")),
        ] {
            let body = r#"{"kind": "accepted", "reason": "x"}"#;
            let (st, v) = call(&app, "key-a", method, &uri, Some(body)).await;
            assert_eq!((st, v["code"].as_str()), (403, Some("operator_only")), "a tenant key on {uri}: {v}");
        }
        let (st, page) = call(&app, "key-ops", Method::GET, "/v1/ops/inventory-findings", None).await;
        assert_eq!(st, 200, "{page}");
        let items = page["items"].as_array().unwrap();
        assert_eq!(items.len(), 1, "one record for the two runs: {page}");
        assert_eq!(
            (&items[0]["id"], &items[0]["times_seen"], &items[0]["status"]),
            (&json!(id), &json!(2), &json!("open"))
        );
        assert_eq!(items[0]["difference"], json!({"available": 2, "reserved": 0, "sold": 0}));
        for bad in ["status=nope", "limit=0", "cursor=zz"] {
            let (st, v) = call(&app, "key-ops", Method::GET, &format!("/v1/ops/inventory-findings?{bad}"), None).await;
            assert_eq!((st, v["field"].as_str()), (422, bad.split('=').next()), "{bad}: {v}");
        }

        let settle = format!("/v1/ops/inventory-findings/{id}/settle");
        for (body, field) in [
            (r#"{"kind": "corrective_entry"}"#, "reason"),
            (r#"{"kind": "corrective_entry", "reason": "  "}"#, "reason"),
            (r#"{"kind": "fix", "reason": "x"}"#, "kind"),
        ] {
            let (st, v) = call(&app, "key-ops", Method::POST, &settle, Some(body)).await;
            assert_eq!((st, v["field"].as_str()), (422, Some(field)), "{body}: {v}");
        }
        let body = r#"{"kind": "accepted", "reason": "x"}"#;
        let (st, _) = call(&app, "key-ops", Method::POST, "/v1/ops/inventory-findings/nope/settle", Some(body)).await;
        assert_eq!(st, 404);

        let body = r#"{"kind": "corrective_entry", "reason": "ledger write lost on 2026-11-30"}"#;
        let (st, v) = call(&app, "key-ops", Method::POST, &settle, Some(body)).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!((&v["status"], &v["settlement"]["kind"]), (&json!("settled"), &json!("corrective_entry")), "{v}");
        assert!(
            v["settlement"]["by"].as_str().is_some_and(|b| !b.is_empty()) && v["settlement"]["entry_id"].is_string()
        );
        let (st, again) = call(&app, "key-ops", Method::POST, &settle, Some(body)).await;
        assert_eq!((st, again["code"].as_str()), (409, Some("already_settled")), "{again}");

        let (_, stock) = call(&app, "key-a", Method::GET, "/v1/inventory/1001", None).await;
        assert_eq!(stock["available"], 7, "the counters did not move: {stock}");
        let (_, ledger) = call(&app, "key-a", Method::GET, "/v1/inventory/1001/ledger", None).await;
        let last = ledger["items"].as_array().unwrap().last().cloned().unwrap();
        assert_eq!((&last["kind"], &last["delta_available"]), (&json!("correction"), &json!(2)), "{ledger}");
        let (_, report) = call(&app, "key-a", Method::POST, "/v1/ops/reconcile", Some("")).await;
        assert_eq!(report["discrepancies"], json!([]), "{report}");
        let (_, open) = call(&app, "key-ops", Method::GET, "/v1/ops/inventory-findings?status=open", None).await;
        assert_eq!(open["items"], json!([]), "{open}");
        let (_, settled) = call(&app, "key-ops", Method::GET, "/v1/ops/inventory-findings?status=settled", None).await;
        assert_eq!(settled["items"][0]["id"], json!(id), "{settled}");
    }

    #[tokio::test]
    async fn bad_input_is_400_or_422_naming_the_field() {
        let app = app().await;
        call(&app, "key-a", Method::PUT, "/v1/inventory/1001", Some(r#"{"on_hand": 2}"#)).await;
        let negative = r#"{"order_id": "o1", "user_id": "u1", "items": [{"sku_id": "1001", "qty": -1}]}"#;
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/orders", Some(negative)).await;
        assert_eq!(status, 422, "{body}");
        assert_eq!(body["field"], "items[0].qty");
        let wrong_type = r#"{"order_id": "o1", "user_id": "u1", "items": [{"sku_id": "1001", "qty": "two"}]}"#;
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/orders", Some(wrong_type)).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["field"], "items[0].qty");
        let (status, body) = call(&app, "key-a", Method::PUT, "/v1/inventory/1002", Some(r#"{"on_hand": "x"}"#)).await;
        assert_eq!((status, body["field"].clone()), (400, json!("on_hand")));
        let (status, _) = call(&app, "key-a", Method::PUT, "/v1/inventory/1002", Some("{")).await;
        assert_eq!(status, 400);
        let adj = r#"{"delta": 1, "source": "gift", "idempotency_key": "k"}"#;
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/inventory/1001/adjustments", Some(adj)).await;
        assert_eq!((status, body["field"].clone()), (422, json!("source")));
        let adj = r#"{"delta": -5, "source": "damage", "idempotency_key": "k"}"#;
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/inventory/1001/adjustments", Some(adj)).await;
        assert_eq!((status, body["code"].clone()), (409, json!("insufficient_stock")));
        let adj = r#"{"delta": 3, "source": "purchase_order", "idempotency_key": "k"}"#;
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/inventory/1001/adjustments", Some(adj)).await;
        assert_eq!((status, body["available"].clone()), (200, json!(5)));
        // No key at all: 422 naming the body's field; the header alone is the key.
        let adj = r#"{"delta": 1, "source": "purchase_order"}"#;
        let (status, body) = call(&app, "key-a", Method::POST, "/v1/inventory/1001/adjustments", Some(adj)).await;
        assert_eq!((status, body["field"].clone()), (422, json!("idempotency_key")), "{body}");
        let req = Request::builder()
            .method(Method::POST)
            .uri("/v1/inventory/1001/adjustments")
            .header("authorization", "Bearer key-a")
            .header("content-type", "application/json")
            .header("idempotency-key", "k")
            .body(HttpBody::from(r#"{"delta": 3, "source": "purchase_order"}"#))
            .unwrap();
        let res = app.clone().oneshot(req).await.unwrap();
        let bytes = res.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["available"], json!(5), "the header's k is the body's k: applied once: {body}");
        let (status, _) = call(&app, "key-a", Method::GET, "/v1/inventory/1001/ledger?limit=0", None).await;
        assert_eq!(status, 422);
        let (status, _) = call(&app, "key-a", Method::GET, "/v1/inventory/1001/ledger?cursor=zz", None).await;
        assert_eq!(status, 422);
        let (status, _) = call(&app, "key-a", Method::GET, "/v1/inventory/a%23b", None).await;
        assert_eq!(status, 422);
        let (status, _) = call(&app, "nope", Method::GET, "/v1/inventory/1001", None).await;
        assert_eq!(status, 401);
    }
}
