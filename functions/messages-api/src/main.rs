//! The `messages-api` function: the routes of the Tidings HTTP API for templates,
//! notifications and workflows, behind their own API Gateway routes. `tidings serve` serves them
//! in its one router.

fn main() -> std::process::ExitCode {
    tidings_functions::messages_api()
}
