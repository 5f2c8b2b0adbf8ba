//! The `public-api` function: the routes of the Tidings HTTP API that a buyer's browser or mail
//! client and the shop's pages reach without an API key (tracking, unsubscribe, the preferences
//! page, `/v1/me`, the site elements' script), behind their own API Gateway routes. `tidings
//! serve` serves them in its one router.

fn main() -> std::process::ExitCode {
    tidings_functions::public_api()
}
