#![no_main]
//! cargo-fuzz target: the body is `epp::fuzzing::extproc_stream` (see its docs for the input format).

libfuzzer_sys::fuzz_target!(|data: &[u8]| epp::fuzzing::extproc_stream(data));
