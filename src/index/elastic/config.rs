//! Connection settings and client construction. Credentials come from
//! environment variables or files and are never printed: [`Secret`] hides
//! them from `Debug` and `Display`.

use std::path::PathBuf;
use std::time::Duration;

use elasticsearch::auth::Credentials;
use elasticsearch::cert::{Certificate, CertificateValidation};
use elasticsearch::http::transport::{SingleNodeConnectionPool, TransportBuilder};
use elasticsearch::http::Url;
use elasticsearch::Elasticsearch;

use super::ElasticError;
use crate::secret::{read_secret, Secret};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    None,
    Basic {
        username: String,
        password: Secret,
    },
    ApiKey {
        id: String,
        key: Secret,
    },
    /// The base64 `id:key` that Elastic's UI and API hand out as `encoded`.
    EncodedApiKey(Secret),
}

/// Where and how to reach Elasticsearch.
#[derive(Debug, Clone)]
pub struct ElasticConfig {
    /// `http://host:9200` or `https://host:9200`.
    pub url: Url,
    pub auth: Auth,
    /// PEM file of a CA certificate to trust (self-signed clusters).
    pub ca_cert: Option<PathBuf>,
    /// Prefix of the aliases and indexes (`<prefix>-files`, ...).
    pub prefix: String,
    /// Request timeout ([`REQUEST_TIMEOUT`]).
    pub timeout: Duration,
    /// Primary shards of the meta index when denorm creates it (review of
    /// Elasticsearch, F12: every commit of every partition is a conditional
    /// write of its meta document; with more shards they spread over as
    /// many primaries, routed by id). An existing meta index keeps its own.
    pub meta_shards: u32,
    /// The tenants a new generation gives indexes of their own
    /// (`DENORM_ES_DEDICATED_TENANTS`; see [`super::placement`]): valid
    /// tenant ids, in order, each once.
    pub dedicated: Vec<String>,
}

/// How long the client waits for an answer: above the longest wait a bulk
/// asks of the server ([`super::bulk::SERVER_WAIT`], 30 s), with room for a
/// queued request, so that a request is sent again only once the server
/// has given it up (review F8).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(90);

/// Environment variables read by [`ElasticConfig::from_env`].
pub mod env {
    pub const USERNAME: &str = "DENORM_ES_USERNAME";
    pub const USERNAME_FILE: &str = "DENORM_ES_USERNAME_FILE";
    pub const PASSWORD: &str = "DENORM_ES_PASSWORD";
    pub const PASSWORD_FILE: &str = "DENORM_ES_PASSWORD_FILE";
    pub const API_KEY_ID: &str = "DENORM_ES_API_KEY_ID";
    pub const API_KEY: &str = "DENORM_ES_API_KEY";
    pub const API_KEY_FILE: &str = "DENORM_ES_API_KEY_FILE";
    pub const API_KEY_ENCODED: &str = "DENORM_ES_API_KEY_ENCODED";
    pub const API_KEY_ENCODED_FILE: &str = "DENORM_ES_API_KEY_ENCODED_FILE";
    pub const CA_CERT: &str = "DENORM_ES_CA_CERT";
    pub const PREFIX: &str = "DENORM_ES_PREFIX";
    pub const META_SHARDS: &str = "DENORM_ES_META_SHARDS";
    pub const DEDICATED_TENANTS: &str = "DENORM_ES_DEDICATED_TENANTS";
}

/// The most primary shards [`ElasticConfig::meta_shards`] takes: one per
/// partition's meta document is already more than a commit rate needs.
pub const MAX_META_SHARDS: u32 = 64;

/// The tenants of `DENORM_ES_DEDICATED_TENANTS` (comma-separated; blanks
/// ignored), each a valid tenant id.
fn dedicated_tenants(list: &str) -> Result<Vec<String>, ElasticError> {
    let mut out = std::collections::BTreeSet::new();
    for t in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        crate::command::tenant::validate(t).map_err(|e| ElasticError::Config(format!("{} names {t:?}: {e}", env::DEDICATED_TENANTS)))?;
        out.insert(t.to_string());
    }
    Ok(out.into_iter().collect())
}

/// The longest `DENORM_ES_PREFIX`: a tenant's own index or alias adds up to 110
/// bytes to it (`-t-<tenant>-files-g<generation>-r<revision>`), and Elasticsearch
/// takes names of 255.
pub const MAX_PREFIX_LEN: usize = 100;

/// `DENORM_ES_PREFIX`, as Elasticsearch takes it in an index name
/// (lowercase letters, digits, `_`, `.` and `-`, not first), and without
/// [`super::names::TENANT_MARK`]: `<prefix>-t-<tenant>-files-000001` is a
/// tenant's own index, so a prefix `search-t-acme` would name the shared
/// index of one deployment and tenant `acme`'s own of the deployment
/// `search`, and a name alone could not tell them apart.
fn prefix(value: Option<String>) -> Result<String, ElasticError> {
    let Some(p) = value else { return Ok("denorm".into()) };
    let why = if p.is_empty() || p.len() > MAX_PREFIX_LEN {
        format!("must be 1 to {MAX_PREFIX_LEN} bytes")
    } else if !p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')) || !p.as_bytes()[0].is_ascii_alphanumeric() {
        "may hold only lowercase letters, digits, `_`, `.` and `-`, and must start with a letter or a digit".into()
    } else if p.contains(super::names::TENANT_MARK) || p.ends_with("-t") {
        format!("may not contain {:?} (it marks a tenant's own indexes) nor end with \"-t\"", super::names::TENANT_MARK)
    } else {
        return Ok(p);
    };
    Err(ElasticError::Config(format!("{} {p:?} {why}", env::PREFIX)))
}

impl ElasticConfig {
    /// Settings for `url`, credentials from `lookup` (the environment in
    /// production; a map in tests).
    pub fn from_lookup(url: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ElasticError> {
        let url = Url::parse(url).map_err(|e| ElasticError::Config(format!("{url:?} is not a URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ElasticError::Config(format!("{url} must be http:// or https://")));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(ElasticError::Config(format!("put credentials in {} / {} (or the _FILE variants), not in the URL", env::USERNAME, env::PASSWORD)));
        }
        let secret = |value: &str, file: &str| read_secret(&lookup, value, file).map_err(ElasticError::Config);
        let username = secret(env::USERNAME, env::USERNAME_FILE)?.map(|u| u.expose().to_string());
        let basic = match (username, secret(env::PASSWORD, env::PASSWORD_FILE)?) {
            (Some(username), Some(password)) => Some(Auth::Basic { username, password }),
            (Some(_), None) => return Err(ElasticError::Config(format!("{} is set but no password", env::USERNAME))),
            (None, Some(_)) => return Err(ElasticError::Config(format!("a password is set but no {}", env::USERNAME))),
            (None, None) => None,
        };
        let api_key = match (lookup(env::API_KEY_ID), secret(env::API_KEY, env::API_KEY_FILE)?) {
            (Some(id), Some(key)) => Some(Auth::ApiKey { id, key }),
            (None, None) => None,
            _ => return Err(ElasticError::Config(format!("set both {} and {} (or its _FILE)", env::API_KEY_ID, env::API_KEY))),
        };
        let encoded = match secret(env::API_KEY_ENCODED, env::API_KEY_ENCODED_FILE)? {
            Some(key) => {
                let k = key.expose();
                if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'-' | b'_')) {
                    return Err(ElasticError::Config(format!(
                        "{} must be the base64 `encoded` value of an API key (for an id and a key, use {} and {})",
                        env::API_KEY_ENCODED,
                        env::API_KEY_ID,
                        env::API_KEY
                    )));
                }
                Some(Auth::EncodedApiKey(key))
            }
            None => None,
        };
        let auth = match [basic, api_key, encoded].into_iter().flatten().collect::<Vec<_>>().as_slice() {
            [] => Auth::None,
            [a] => a.clone(),
            _ => return Err(ElasticError::Config("choose one of basic authentication, an API key id and key, or an encoded API key".into())),
        };
        let meta_shards = match lookup(env::META_SHARDS) {
            None => 1,
            Some(v) => match v.trim().parse::<u32>() {
                Ok(n) if (1..=MAX_META_SHARDS).contains(&n) => n,
                _ => return Err(ElasticError::Config(format!("{} must be a number of shards from 1 to {MAX_META_SHARDS}, not {v:?}", env::META_SHARDS))),
            },
        };
        let dedicated = dedicated_tenants(lookup(env::DEDICATED_TENANTS).as_deref().unwrap_or(""))?;
        Ok(ElasticConfig { url, auth, ca_cert: lookup(env::CA_CERT).map(PathBuf::from), prefix: prefix(lookup(env::PREFIX))?, timeout: REQUEST_TIMEOUT, meta_shards, dedicated })
    }

    pub fn from_env(url: &str) -> Result<Self, ElasticError> {
        Self::from_lookup(url, |k| std::env::var(k).ok())
    }

    /// Builds the client.
    pub fn client(&self) -> Result<Elasticsearch, ElasticError> {
        let mut b = TransportBuilder::new(SingleNodeConnectionPool::new(self.url.clone())).timeout(self.timeout);
        match &self.auth {
            Auth::None => {}
            Auth::Basic { username, password } => b = b.auth(Credentials::Basic(username.clone(), password.expose().to_string())),
            Auth::ApiKey { id, key } => b = b.auth(Credentials::ApiKey(id.clone(), key.expose().to_string())),
            Auth::EncodedApiKey(key) => b = b.auth(Credentials::EncodedApiKey(key.expose().to_string())),
        }
        if let Some(path) = &self.ca_cert {
            let pem = std::fs::read(path).map_err(|e| ElasticError::Config(format!("cannot read CA certificate {}: {e}", path.display())))?;
            let cert = Certificate::from_pem(&pem).map_err(|e| ElasticError::Config(format!("CA certificate {}: {e}", path.display())))?;
            b = b.cert_validation(CertificateValidation::Full(cert));
        }
        let transport = b.build().map_err(|e| ElasticError::Config(e.to_string()))?;
        Ok(Elasticsearch::new(transport))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<ElasticConfig, ElasticError> {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        ElasticConfig::from_lookup("http://localhost:9200", move |k| m.get(k).cloned())
    }

    #[test]
    fn reads_credentials_and_hides_them() {
        let c = cfg(&[(env::USERNAME, "elastic"), (env::PASSWORD, "hunter2")]).unwrap();
        assert_eq!(c.auth, Auth::Basic { username: "elastic".into(), password: Secret::new("hunter2") });
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("key");
        std::fs::write(&f, "s3cret\n").unwrap();
        let c = cfg(&[(env::API_KEY_ID, "id1"), (env::API_KEY_FILE, f.to_str().unwrap())]).unwrap();
        assert_eq!(c.auth, Auth::ApiKey { id: "id1".into(), key: Secret::new("s3cret") });
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn reads_basic_credentials_from_mounted_files() {
        let dir = tempfile::tempdir().unwrap();
        let (u, p) = (dir.path().join("username"), dir.path().join("password"));
        std::fs::write(&u, "elastic\n").unwrap();
        std::fs::write(&p, "hunter2").unwrap();
        let c = cfg(&[(env::USERNAME_FILE, u.to_str().unwrap()), (env::PASSWORD_FILE, p.to_str().unwrap())]).unwrap();
        assert_eq!(c.auth, Auth::Basic { username: "elastic".into(), password: Secret::new("hunter2") });
        let missing = cfg(&[(env::USERNAME_FILE, "/nonexistent/username"), (env::PASSWORD, "p")]).unwrap_err().to_string();
        assert!(missing.contains(env::USERNAME_FILE), "{missing}");
    }

    #[test]
    fn rejects_incomplete_or_ambiguous_credentials() {
        assert!(cfg(&[(env::USERNAME, "u")]).is_err());
        assert!(cfg(&[(env::API_KEY_ID, "i")]).is_err());
        assert!(cfg(&[(env::USERNAME, "u"), (env::PASSWORD, "p"), (env::API_KEY_ID, "i"), (env::API_KEY, "k")]).is_err());
        assert!(ElasticConfig::from_lookup("http://u:p@localhost:9200", |_| None).is_err());
        assert!(ElasticConfig::from_lookup("ftp://localhost", |_| None).is_err());
        assert_eq!(cfg(&[]).unwrap().auth, Auth::None);
        assert!(cfg(&[(env::API_KEY_ID, "i"), (env::API_KEY, "k"), (env::API_KEY_ENCODED, "a2lkOnMzY3JldA==")]).is_err());
        assert!(cfg(&[(env::API_KEY_ENCODED, "not base64!")]).is_err());
    }

    #[test]
    fn reads_the_dedicated_tenants_and_refuses_an_invalid_one() {
        assert!(cfg(&[]).unwrap().dedicated.is_empty());
        assert_eq!(cfg(&[(env::DEDICATED_TENANTS, " globex, acme,,acme ")]).unwrap().dedicated, vec!["acme", "globex"]);
        let e = cfg(&[(env::DEDICATED_TENANTS, "acme,Big Corp")]).unwrap_err().to_string();
        assert!(e.contains("DENORM_ES_DEDICATED_TENANTS names \"Big Corp\""), "{e}");
    }

    #[test]
    fn refuses_a_prefix_elasticsearch_would_refuse_or_one_that_names_a_tenants_own_indexes() {
        assert_eq!(cfg(&[]).unwrap().prefix, "denorm");
        assert_eq!(cfg(&[(env::PREFIX, "search.v2_prod-1")]).unwrap().prefix, "search.v2_prod-1");
        for bad in ["", "Denorm", "-denorm", "_x", "a b", "a*b", "search-t-acme", "search-t", &"x".repeat(101)] {
            let e = cfg(&[(env::PREFIX, bad)]).unwrap_err().to_string();
            assert!(e.contains(env::PREFIX), "{bad}: {e}");
        }
    }

    #[test]
    fn reads_the_meta_shards_and_refuses_what_is_out_of_range() {
        assert_eq!(cfg(&[]).unwrap().meta_shards, 1);
        assert_eq!(cfg(&[(env::META_SHARDS, "6")]).unwrap().meta_shards, 6);
        for bad in ["0", "65", "two", "-1", ""] {
            let e = cfg(&[(env::META_SHARDS, bad)]).unwrap_err().to_string();
            assert!(e.contains(env::META_SHARDS) && e.contains("1 to 64"), "{bad}: {e}");
        }
    }
}
