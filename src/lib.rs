pub mod config;
pub mod endpoint;
pub mod metrics;
pub mod prefix;
pub mod request;
pub mod scheduling;
