//! tidings-aws
