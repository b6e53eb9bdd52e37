#![no_main]
//! cargo-fuzz target: the body is `epp::fuzzing::request_parser` (see its docs for the input format).

libfuzzer_sys::fuzz_target!(|data: &[u8]| epp::fuzzing::request_parser(data));
