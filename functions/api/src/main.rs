//! The `api` function: the Tidings HTTP API behind API Gateway (HTTP API, payload 2.0). The
//! same axum router `tidings serve` serves locally.

fn main() -> std::process::ExitCode {
    tidings_functions::api()
}
