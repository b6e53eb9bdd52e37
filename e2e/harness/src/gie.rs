//! GIE's own module source (charts, CRDs, `apix/`), for tests that run upstream's artefacts:
//! downloaded into the Go module cache on first use, so these tests need the Go toolchain.

use std::path::PathBuf;

/// The GIE release the tests take charts and CRDs from.
pub const MODULE: &str = "sigs.k8s.io/gateway-api-inference-extension@v1.5.0";

/// The module's source directory (`go mod download -json`); `what` names what the caller
/// wanted it for, in the panic when Go is missing.
pub fn module_dir(what: &str) -> PathBuf {
    let out = std::process::Command::new("go")
        .args(["mod", "download", "-json", MODULE])
        .current_dir(std::env::temp_dir())
        .env("GOFLAGS", "-mod=mod")
        .output()
        .unwrap_or_else(|e| panic!("the Go toolchain is needed for {what} (go mod download): {e}"));
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "go mod download {MODULE}: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        info["Error"].is_null(),
        "go mod download {MODULE}: {}",
        info["Error"]
    );
    PathBuf::from(
        info["Dir"]
            .as_str()
            .expect("go mod download -json names a Dir"),
    )
}
