//! What a pool needs from the substrate: start a warm function container, run a call in
//! it, notice its loss, destroy it. The real backend is a [`Runtime`]; unit tests use a fake.

use async_trait::async_trait;
use bytes::Bytes;
use std::sync::Arc;
use warren_proto::{FunctionInit, InvokeSpec};
use warren_runtime::{Instance, InvokeOutput, Runtime, RuntimeError, SandboxSpec};
use warren_types::{NodeId, SandboxId};

use super::PoolKey;

/// One warm function container.
#[async_trait]
pub trait Warm: Send + Sync + 'static {
    /// Runs one call (in a fresh environment inside the container).
    async fn call(&self, spec: InvokeSpec, input: Bytes) -> Result<InvokeOutput, RuntimeError>;
    /// Resolves when the container's agent is gone.
    async fn lost(&self);
    fn is_lost(&self) -> bool;
    /// Kills the container and removes what it holds on the host. Idempotent.
    async fn destroy(&self);
}

/// Starts warm containers.
#[async_trait]
pub trait WarmBackend: Send + Sync + 'static {
    async fn start(&self, key: &PoolKey) -> Result<Arc<dyn Warm>, RuntimeError>;
}

/// Warm containers made by a substrate runtime.
pub struct RuntimeBackend {
    pub runtime: Arc<dyn Runtime>,
    pub node: NodeId,
}

struct RuntimeWarm {
    instance: Arc<dyn Instance>,
}

#[async_trait]
impl Warm for RuntimeWarm {
    async fn call(&self, spec: InvokeSpec, input: Bytes) -> Result<InvokeOutput, RuntimeError> {
        self.instance.agent().invoke(spec, input).await
    }
    async fn lost(&self) {
        self.instance.lost().await
    }
    fn is_lost(&self) -> bool {
        self.instance.agent().is_closed()
    }
    async fn destroy(&self) {
        if let Err(e) = self.instance.destroy().await {
            tracing::warn!(id = %self.instance.id(), error = %e, "destroying a warm container");
        }
    }
}

#[async_trait]
impl WarmBackend for RuntimeBackend {
    async fn start(&self, key: &PoolKey) -> Result<Arc<dyn Warm>, RuntimeError> {
        let mut labels = std::collections::BTreeMap::new();
        labels.insert("warren.function".to_string(), "warm".to_string());
        let spec = SandboxSpec {
            id: SandboxId::generate(&self.node),
            image: key.image.clone(),
            limits: key.limits.clone(),
            hostname: "function".into(),
            labels,
            devpts: false,
            network: false,
            resolv_conf: None,
            on_netns: None,
        };
        let init = FunctionInit {
            interpreter: key.interpreter.clone(),
            preload: key.preload.clone(),
        };
        let instance = self.runtime.create_function(&spec, &init).await?;
        Ok(Arc::new(RuntimeWarm { instance }))
    }
}

/// The backend of a node without a runtime that can make function containers.
pub struct NoBackend;

#[async_trait]
impl WarmBackend for NoBackend {
    async fn start(&self, _key: &PoolKey) -> Result<Arc<dyn Warm>, RuntimeError> {
        Err(warren_runtime::Unsupported::NoFunctionSubstrate.into())
    }
}
