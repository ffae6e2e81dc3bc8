//! The Elasticsearch-API server of the integration tests: `DENORM_ES_URL`
//! (scripts/test.sh starts noida-db, an independent server, and sets it),
//! or a private noida-db started from the cached install. Each test
//! process works under an index prefix of its own (`DENORM_ES_PREFIX`,
//! inherited by every `denorm` process the test starts: nextest runs each
//! test in a process of its own).

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

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
        HANDLES.fetch_add(1, Ordering::SeqCst);
        return Elastic { url, _private: None };
    }
    Elastic::private()
}

/// This test process's index prefix (chosen at the first call).
pub fn prefix() -> String {
    if let Ok(p) = std::env::var(env::PREFIX) {
        return p;
    }
    new_prefix()
}

/// A fresh index prefix for the rest of this test process (a test that
/// builds several indexes one after another, each of its own topic).
pub fn new_prefix() -> String {
    let p = super::unique("dt");
    std::env::set_var(env::PREFIX, &p);
    remove_when_done(&p);
    p
}

/// The index prefixes this test process wrote under, and the servers'
/// handles alive: when the last handle of the suite's server is dropped
/// and the test did not fail, the indexes under these prefixes are
/// deleted. The suite's server otherwise kept every test's indexes, and
/// grew slower with them: a rename of 20,000 files took 25-30 s on a
/// server holding 1,600 tests' indexes against 8 s on a fresh one, and a
/// test's wait timed out in CI. A failed test's indexes are kept, for
/// inspection.
static PREFIXES: Mutex<Vec<String>> = Mutex::new(Vec::new());
static HANDLES: AtomicUsize = AtomicUsize::new(0);

/// Deletes the indexes under `prefix` (a bench run's, say) with this
/// process's own, once the test is done.
pub fn remove_when_done(prefix: &str) {
    PREFIXES.lock().unwrap().push(prefix.to_string());
}

/// Deletes every index under `prefixes` on `url`, by name (Elasticsearch
/// refuses wildcard deletes by default: action.destructive_requires_name).
fn remove_indexes(url: &str, prefixes: &[String]) -> Result<(), String> {
    use elasticsearch::indices::IndicesDeleteParts;
    let client = ElasticConfig::from_env(url).map_err(|e| e.to_string())?.client().map_err(|e| e.to_string())?;
    super::rt().block_on(async {
        for p in prefixes {
            let names = listed(&client, p).await?;
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            for chunk in names.chunks(50) {
                client.indices().delete(IndicesDeleteParts::Index(chunk)).send().await.map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    })
}

/// The names of the indexes under `prefix`.
async fn listed(client: &elasticsearch::Elasticsearch, prefix: &str) -> Result<Vec<String>, String> {
    use elasticsearch::cat::CatIndicesParts;
    let pattern = format!("{prefix}*");
    let r = client.cat().indices(CatIndicesParts::Index(&[&pattern])).format("json").h(&["index"]).send().await.map_err(|e| e.to_string())?;
    let listed: serde_json::Value = r.json().await.map_err(|e| e.to_string())?;
    Ok(listed.as_array().into_iter().flatten().filter_map(|i| i["index"].as_str().map(str::to_string)).collect())
}

/// The names of the indexes under this process's prefix at `url`.
pub fn indexes(url: &str) -> Vec<String> {
    let client = ElasticConfig::from_env(url).unwrap().client().unwrap();
    let mut names = super::rt().block_on(listed(&client, &prefix())).unwrap();
    names.sort();
    names
}

impl Drop for Elastic {
    fn drop(&mut self) {
        // A private server goes with its data; the suite's keeps it while
        // another handle of this process is alive.
        if self._private.is_some() || HANDLES.fetch_sub(1, Ordering::SeqCst) != 1 || std::thread::panicking() {
            return;
        }
        let prefixes = std::mem::take(&mut *PREFIXES.lock().unwrap());
        if let Err(e) = remove_indexes(&self.url, &prefixes) {
            eprintln!("could not remove this test's indexes under {prefixes:?}: {e}");
        }
    }
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
    try_dump(url).unwrap()
}

/// [`dump`], for a condition polled while a worker starts: nothing while
/// the worker has not created the indexes yet (a poll that came first
/// failed on `index_not_found_exception`, seen in CI).
pub fn dump_once_created(url: &str) -> Vec<Doc> {
    match try_dump(url) {
        Ok(docs) => docs,
        Err(e) if format!("{e:?}").contains("index_not_found_exception") => Vec::new(),
        Err(e) => panic!("dumping {url}: {e:?}"),
    }
}

fn try_dump(url: &str) -> Result<Vec<Doc>, denorm::index::IndexError> {
    let rt = super::rt();
    let mut out = Vec::new();
    let search = denorm::index::Backend::search(&backend(url, &rt, ""))?;
    search.dump(&mut |d| out.push(d))?;
    Ok(out)
}
