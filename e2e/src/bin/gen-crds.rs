//! Writes `config/crd/*.yaml` from epp's CRD types (`hack/gen-crds.sh` runs it).

use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/crd"));
    std::fs::create_dir_all(&dir)?;
    for (file, crd) in epp::discovery::k8s::crd::definitions() {
        std::fs::write(dir.join(&file), epp::discovery::k8s::crd::render(&crd)?)?;
        println!("wrote {}", dir.join(&file).display());
    }
    Ok(())
}
