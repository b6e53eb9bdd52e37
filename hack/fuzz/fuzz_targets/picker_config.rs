#![no_main]
//! cargo-fuzz target: the body is `epp::fuzzing::picker_config` (see its docs for the input format).

libfuzzer_sys::fuzz_target!(|data: &[u8]| epp::fuzzing::picker_config(data));
