//! Detecting that a file's content changed, by polling.
//!
//! Polling (once a second by default) works the same on every filesystem and survives the
//! symlink swap Kubernetes uses to update mounted ConfigMaps, where inotify watches go stale.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

/// Remembers the last content seen at a path.
#[derive(Debug)]
pub(crate) struct FileWatch {
    path: PathBuf,
    last: Option<u64>,
}

impl FileWatch {
    pub(crate) fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            last: None,
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the file; returns its text when it differs from the last call (always the first
    /// time). A read error is returned every time so the caller can report it.
    pub(crate) fn changed(&mut self) -> std::io::Result<Option<String>> {
        let text = std::fs::read_to_string(&self.path)?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut h);
        let digest = h.finish();
        if self.last == Some(digest) {
            return Ok(None);
        }
        self.last = Some(digest);
        Ok(Some(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_only_changes() {
        let dir = std::env::temp_dir().join(format!("epp-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, "a").unwrap();
        let mut w = FileWatch::new(&path);
        assert_eq!(w.changed().unwrap().as_deref(), Some("a"));
        assert_eq!(w.changed().unwrap(), None);
        std::fs::write(&path, "b").unwrap();
        assert_eq!(w.changed().unwrap().as_deref(), Some("b"));
        std::fs::remove_file(&path).unwrap();
        assert!(w.changed().is_err());
    }
}
