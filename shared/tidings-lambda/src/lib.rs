//! tidings-lambda
