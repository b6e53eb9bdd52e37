//! LoRA adapters: which are loaded, with vLLM's ids and error messages.
//!
//! Why: `lora-affinity` routing reads `vllm:lora_requests_info` and counts on
//! an adapter being servable only where it is loaded. Loading is bookkeeping
//! here (no weights); the engine enforces `--max-loras` per batch, and the
//! running/waiting adapter lists come from the engine's queues.

use thiserror::Error;

use super::engine::LoraRef;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum LoraError {
    #[error("The lora adapter '{0}' has already been loaded.")]
    AlreadyLoaded(String),
    #[error("The lora adapter '{0}' cannot be found.")]
    NotFound(String),
    #[error("LoRA is not enabled on this server (start it with --enable-lora).")]
    Disabled,
}

/// The adapters a pod can serve.
#[derive(Debug)]
pub struct LoraRegistry {
    enabled: bool,
    next_id: u64,
    loaded: Vec<LoraRef>,
}

impl LoraRegistry {
    /// A registry with `modules` preloaded (ids from 1, as vLLM assigns them).
    pub fn new(enabled: bool, modules: &[String]) -> Self {
        let mut registry = Self {
            enabled,
            next_id: 1,
            loaded: Vec::new(),
        };
        for name in modules {
            let _ = registry.load(name);
        }
        registry
    }

    pub fn load(&mut self, name: &str) -> Result<LoraRef, LoraError> {
        if !self.enabled {
            return Err(LoraError::Disabled);
        }
        if self.get(name).is_some() {
            return Err(LoraError::AlreadyLoaded(name.to_owned()));
        }
        let lora = LoraRef {
            id: self.next_id,
            name: name.to_owned(),
        };
        self.next_id += 1;
        self.loaded.push(lora.clone());
        Ok(lora)
    }

    pub fn unload(&mut self, name: &str) -> Result<(), LoraError> {
        let before = self.loaded.len();
        self.loaded.retain(|l| l.name != name);
        if self.loaded.len() == before {
            return Err(LoraError::NotFound(name.to_owned()));
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<LoraRef> {
        self.loaded.iter().find(|l| l.name == name).cloned()
    }

    pub fn loaded(&self) -> &[LoraRef] {
        &self.loaded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapters_load_once_and_unload() {
        let mut r = LoraRegistry::new(true, &["a".into()]);
        assert_eq!(r.get("a").map(|l| l.id), Some(1));
        assert_eq!(r.load("a"), Err(LoraError::AlreadyLoaded("a".into())));
        assert_eq!(r.load("b").map(|l| l.id), Ok(2));
        assert_eq!(r.unload("a"), Ok(()));
        assert_eq!(r.unload("a"), Err(LoraError::NotFound("a".into())));
        assert_eq!(r.loaded().len(), 1);
    }

    #[test]
    fn a_disabled_registry_refuses_adapters() {
        let mut r = LoraRegistry::new(false, &["a".into()]);
        assert!(r.loaded().is_empty());
        assert_eq!(r.load("b"), Err(LoraError::Disabled));
    }
}
