//! The `ws-connections` function: the API Gateway WebSocket API of the inbox's live feed.
//! `$connect` checks the short-lived signed token (`?token=`, from
//! `POST /v1/users/{id}/inbox/token`) and remembers the connection for its user with a TTL;
//! `$disconnect` forgets it; `$default` answers `{"type":"since","message_id":...}` with what the
//! client missed. Pushes of new messages come from the outbox-relay (the inbox's stream).

fn main() -> std::process::ExitCode {
    tidings_functions::ws_connections()
}
