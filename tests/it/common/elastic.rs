//! The Elasticsearch-API server of the integration tests: `DENORM_ES_URL`
//! (scripts/test.sh starts noida-db, an independent server, and sets it),
//! or a private noida-db started from the cached install. Each test
//! process works under an index prefix of its own (`DENORM_ES_PREFIX`,
//! inherited by every `denorm` process the test starts: nextest runs each
//! test in a process of its own).

use std::path::Path;

use denorm::index::elastic::backend::ElasticBackend;
use denorm::index::elastic::config::{env, ElasticConfig};
use denorm::index::Doc;

/// A server: the suite's, or one of this test's own (stopped on drop).
pub struct Elastic {
    pub url: String,
    _private: Option<super::Private>,
}

/// The suite's server, or a private one; either way this process's index
/// prefix is set (see the module's doc).
pub fn elastic() -> Elastic {
    prefix();
    if let Ok(url) = std::env::var("DENORM_ES_URL") {
        return Elastic { url, _private: None };
    }
    Elastic::private()
}

/// This test process's index prefix (chosen at the first call).
pub fn prefix() -> String {
    if let Ok(p) = std::env::var(env::PREFIX) {
        return p;
    }
    let p = super::unique("dt");
    std::env::set_var(env::PREFIX, &p);
    p
}

/// A fresh index prefix for the rest of this test process (a test that
/// builds several indexes one after another, each of its own topic).
pub fn new_prefix() -> String {
    let p = super::unique("dt");
    std::env::set_var(env::PREFIX, &p);
    p
}

impl Elastic {
    /// A noida-db of this test's own, from scripts/install-noida.sh
    /// (installed once per machine).
    pub fn private() -> Elastic {
        let (port, private) = super::start_noida("elasticsearch");
        Elastic { url: format!("http://127.0.0.1:{port}"), _private: Some(private) }
    }

    /// The index set of this test process (its prefix) on this server.
    pub fn backend(&self, rt: &tokio::runtime::Runtime, topic: &str) -> ElasticBackend {
        backend(&self.url, rt, topic)
    }
}

/// A backend on `url` under this process's prefix.
pub fn backend(url: &str, rt: &tokio::runtime::Runtime, topic: &str) -> ElasticBackend {
    let cfg = ElasticConfig::from_env(url).unwrap();
    ElasticBackend::new(cfg.client().unwrap(), &cfg.prefix, topic, rt.handle().clone())
}

/// Whether `index` (a `--index` value) is an Elasticsearch URL.
pub fn is_url(index: &Path) -> bool {
    let s = index.to_string_lossy();
    s.starts_with("http://") || s.starts_with("https://")
}

/// Every document under this process's prefix at `url`.
pub fn dump(url: &str) -> Vec<Doc> {
    let rt = super::rt();
    let mut out = Vec::new();
    let search = denorm::index::Backend::search(&backend(url, &rt, "")).unwrap();
    search.dump(&mut |d| out.push(d)).unwrap();
    out
}
