//! The heap a directory rename adds to one shard, on both backends, for
//! the sizes given (default 100,000 and 1,000,000 files): the fan-out
//! memory of issue 9, measured in process, without Kafka.
//!
//! ```sh
//! cargo run --release --example fanout_memory [-- SIZE...]
//! ```
//!
//! - embedded: the files are indexed into a fresh shard and committed, then
//!   renamed through `apply` (pages, intermediate commits, merges), as a
//!   worker does.
//! - elasticsearch: the same rename through the Elasticsearch shard against
//!   a minimal HTTP test double (not Elasticsearch: it keeps no documents)
//!   that generates the point-in-time pages of SIZE matching files on the
//!   fly and acknowledges every bulk item; it checks that every file was
//!   rewritten exactly once. Its own memory is counted too (it is in the
//!   same process) and does not grow with SIZE.
//!
//! Peak `RssAnon` is sampled every 10 ms (the allocator is tuned as
//! `denorm` tunes it). Each size runs in a child process of its own, so
//! one run's freed memory does not hide the next one's.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use denorm::apply::{apply, FanOut, DEFAULT_PAGE_SIZE};
use denorm::command::Command;
use denorm::index::embedded::EmbeddedIndex;
use denorm::index::{Backend, Shard};
use serde_json::{json, Value};

fn rename() -> Command {
    Command::RenamePath { from: "/r/tree".into(), to: "/r/moved".into() }
}

fn file(i: u64) -> (String, String, String) {
    (format!("r-{i}"), format!("/r/tree/d{}", i % 100), format!("file {i} of the benchmark tree, with a few words of contents"))
}

fn embedded(n: u64) -> (u64, u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let index = EmbeddedIndex::open(dir.path(), "t").unwrap();
    index.bind_log(1).unwrap();
    let mut shard = index.open_shard(0, 64 << 20).unwrap();
    for i in 0..n {
        let (id, d, contents) = file(i);
        apply(&mut shard, &Command::UpsertFile { id, path: format!("{d}/file{i}.txt"), contents, previous_path: None }, i, FanOut::pages_of(DEFAULT_PAGE_SIZE)).unwrap();
        if i % 20_000 == 19_999 {
            shard.commit().unwrap();
        }
    }
    shard.commit().unwrap();
    let (written, before, peak) = denorm::alloc::peak_anon_during(|| {
        let w = apply(&mut shard, &rename(), n, FanOut::pages_of(DEFAULT_PAGE_SIZE)).unwrap();
        shard.commit().unwrap();
        w
    });
    (written, before, peak)
}

/// The answer of the test double to one request: point-in-time pages of
/// `n` matching files generated from `search_after`, and every bulk item
/// acknowledged (and checked: each file rewritten once, to the new
/// directory, counted in `acked`).
fn answer(n: u64, acked: &AtomicU64, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    match (method, path) {
        ("GET", "/_alias/denorm-files") => (200, json!({"denorm-files-000001": {"aliases": {"denorm-files": {"is_write_index": true}}}})),
        ("GET", "/denorm-meta/_doc/p0") => (404, json!({"_index": "denorm-meta", "_id": "p0", "found": false})),
        // The generation's placement: none recorded, every tenant shared.
        ("GET", "/denorm-meta/_doc/placement") => (404, json!({"_index": "denorm-meta", "_id": "placement", "found": false})),
        // The shard's claim of its partition when it opens.
        ("POST", "/denorm-meta/_create/p0") => (201, json!({"_index": "denorm-meta", "_id": "p0", "_version": 1, "result": "created", "_seq_no": 0, "_primary_term": 1})),
        (_, "/denorm-files-g0/_refresh" | "/denorm-files-g0,denorm-users-g0,denorm-posts-g0/_refresh") => (200, json!({"_shards": {"total": 1, "successful": 1, "failed": 0}})),
        ("POST", "/denorm-files-g0/_pit") => (200, json!({"id": "pit"})),
        ("DELETE", "/_pit") => (200, json!({"succeeded": true, "num_freed": 1})),
        ("POST", "/_search") => {
            let body: Value = serde_json::from_slice(body).unwrap();
            let size = body["size"].as_u64().unwrap();
            let from = body["search_after"][0].as_u64().map_or(0, |a| a + 1);
            let hits: Vec<Value> = (from..(from + size).min(n))
                .map(|i| {
                    let (id, d, contents) = file(i);
                    json!({"_index": "denorm-files-000001", "_id": id, "_seq_no": i, "_primary_term": 1, "_score": null,
                           "_source": {"id": id, "name": format!("file{i}.txt"), "path": d, "contents": contents, "denorm_pos": 1}, "sort": [i]})
                })
                .collect();
            (200, json!({"pit_id": "pit", "took": 1, "timed_out": false, "_shards": {"total": 1, "successful": 1, "skipped": 0, "failed": 0}, "hits": {"hits": hits}}))
        }
        ("POST", "/_bulk") => {
            let lines: Vec<Value> = String::from_utf8_lossy(body).lines().filter(|l| !l.is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect();
            let mut items = Vec::new();
            for pair in lines.chunks(2) {
                let id = pair[0]["index"]["_id"].as_str().unwrap().to_string();
                assert!(pair[1]["path"].as_str().unwrap().starts_with("/r/moved"), "{:?}", pair[1]);
                acked.fetch_add(1, Ordering::Relaxed);
                items.push(json!({"index": {"_index": "denorm-files-000001", "_id": id, "_version": 2, "result": "updated", "status": 200,
                    "_shards": {"total": 1, "successful": 1, "failed": 0}, "_seq_no": 1, "_primary_term": 1}}));
            }
            (200, json!({"took": 1, "errors": false, "items": items}))
        }
        _ => panic!("the test double has no answer to {method} {path}"),
    }
}

/// A minimal HTTP/1.1 server (keep-alive, `Content-Length` bodies) on
/// loopback that answers with [`answer`] and keeps nothing between
/// requests. (wiremock records every request it matches, which made the
/// double's memory grow with the rename.)
fn serve(n: u64, acked: Arc<AtomicU64>) -> String {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let (conn, acked) = (conn.unwrap(), acked.clone());
            std::thread::spawn(move || {
                let mut out = conn.try_clone().unwrap();
                let mut reader = BufReader::new(conn);
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut parts = line.split_whitespace();
                    let (method, target) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
                    let mut length = 0usize;
                    loop {
                        let mut header = String::new();
                        reader.read_line(&mut header).unwrap();
                        let header = header.trim_end();
                        if header.is_empty() {
                            break;
                        }
                        if let Some((name, value)) = header.split_once(':') {
                            if name.eq_ignore_ascii_case("content-length") {
                                length = value.trim().parse().unwrap();
                            }
                        }
                    }
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body).unwrap();
                    let path = target.split('?').next().unwrap_or("");
                    let (status, value) = answer(n, &acked, &method, path, &body);
                    let value = serde_json::to_vec(&value).unwrap();
                    let head = format!("HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", value.len());
                    if out.write_all(head.as_bytes()).and_then(|_| out.write_all(&value)).is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

fn elastic(n: u64) -> (u64, u64, u64) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let acked = Arc::new(AtomicU64::new(0));
    let url = serve(n, acked.clone());
    let config = denorm::index::elastic::config::ElasticConfig::from_lookup(&url, |_| None).unwrap();
    let backend = denorm::index::elastic::backend::ElasticBackend::new(config.client().unwrap(), "denorm", "t", rt.handle().clone());
    let mut shard = backend.open_shard(0).unwrap();
    let (written, before, peak) = denorm::alloc::peak_anon_during(|| apply(shard.as_mut(), &rename(), n + 1, FanOut::pages_of(DEFAULT_PAGE_SIZE)).unwrap());
    assert_eq!(acked.load(Ordering::Relaxed), n, "every file is rewritten once");
    (written, before, peak)
}

fn main() {
    denorm::alloc::tune();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, size] = &args[..] {
        if let Some(backend) = mode.strip_prefix("--child=") {
            let n: u64 = size.parse().expect("a size");
            let t = Instant::now();
            let (written, before, peak) = if backend == "embedded" { embedded(n) } else { elastic(n) };
            assert_eq!(written, n, "{backend}: the rename rewrote {written} of {n} files");
            println!("{backend}\t{n}\t{written}\t{before}\t{peak}\t{:.1}", t.elapsed().as_secs_f64());
            return;
        }
    }
    let sizes: Vec<u64> = if args.is_empty() { vec![100_000, 1_000_000] } else { args.iter().map(|a| a.parse().expect("sizes in files")).collect() };
    let me = std::env::current_exe().unwrap();
    println!("{:<14} {:>10} {:>12} {:>12} {:>14}", "backend", "files", "heap before", "peak heap", "added by rename");
    for backend in ["embedded", "elasticsearch"] {
        let mut peaks = Vec::new();
        for &n in &sizes {
            let out = std::process::Command::new(&me).arg(format!("--child={backend}")).arg(n.to_string()).output().unwrap();
            assert!(out.status.success(), "{backend} {n}: {}", String::from_utf8_lossy(&out.stderr));
            let line = String::from_utf8_lossy(&out.stdout).to_string();
            let f: Vec<&str> = line.trim().split('\t').collect();
            let (before, peak): (u64, u64) = (f[3].parse().unwrap(), f[4].parse().unwrap());
            println!("{:<14} {:>10} {:>9} MB {:>9} MB {:>11} MB", backend, n, before / 1024, peak / 1024, peak.saturating_sub(before) / 1024);
            peaks.push(peak);
        }
        if let (Some(first), Some(last)) = (peaks.first(), peaks.last()) {
            if peaks.len() > 1 {
                println!("{:<14} peak heap, {} vs {} files: {:.0} %", backend, sizes[sizes.len() - 1], sizes[0], *last as f64 * 100.0 / *first as f64);
            }
        }
    }
}
