//! The deployment files name only what the worker really exports and runs.

use std::collections::BTreeSet;

use denorm::metrics::{ALL, HISTOGRAMS};

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `denorm_*` metric names in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("denorm_") {
        let name: String = rest[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        rest = &rest[i + name.len()..];
        out.push(name);
    }
    out
}

/// The exported family a sample name belongs to, if any.
fn family(name: &str) -> Option<&'static str> {
    if let Some(n) = ALL.iter().find(|n| **n == name) {
        return Some(n);
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if let Some(n) = HISTOGRAMS.iter().find(|n| **n == base) {
                return Some(n);
            }
        }
    }
    None
}

#[test]
fn dashboard_queries_name_exported_metrics() {
    let dash: serde_json::Value = serde_json::from_str(&read("deploy/grafana/dashboards/denorm.json")).unwrap();
    let mut used = BTreeSet::new();
    for panel in dash["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let names = metric_names(expr);
            assert!(!names.is_empty(), "panel {:?} queries no denorm metric: {expr}", panel["title"]);
            for n in names {
                let f = family(&n).unwrap_or_else(|| panic!("panel {:?} queries {n}, which denorm does not export", panel["title"]));
                used.insert(f);
            }
        }
    }
    // The dashboard covers what the issue asks for.
    for needed in [
        "denorm_consumer_lag_messages",
        "denorm_consumer_lag_seconds",
        "denorm_commands_total",
        "denorm_command_documents",
        "denorm_es_bulk_request_seconds",
        "denorm_es_retries_total",
        "denorm_moves_total",
        "denorm_moves_in_flight",
        "denorm_moves_waiting_messages",
        "denorm_move_seconds",
        "denorm_tenant_commands_total",
        "denorm_tenant_apply_delay_seconds",
        "denorm_tenant_fan_out_documents_total",
        "denorm_tenant_dead_letters_total",
        "denorm_consumer_offset_commit_failures_total",
    ] {
        assert!(used.contains(needed), "dashboard lacks {needed}");
    }
    // Issue 47: a tenant selector, from an exported metric, that every
    // per-tenant panel follows.
    let vars = dash["templating"]["list"].as_array().expect("the dashboard's variables");
    let tenant = vars.iter().find(|v| v["name"] == "tenant").expect("a tenant variable");
    let query = tenant["query"]["query"].as_str().unwrap();
    assert!(metric_names(query).iter().all(|n| family(n).is_some()) && !metric_names(query).is_empty(), "{query}");
    for panel in dash["panels"].as_array().unwrap() {
        let expr = panel["targets"][0]["expr"].as_str().unwrap();
        if expr.contains("denorm_tenant_") {
            assert!(expr.contains(r#"tenant=~"$tenant""#), "panel {:?} ignores the tenant selector: {expr}", panel["title"]);
        }
    }
}

#[test]
fn metric_name_check_rejects_unknown_names() {
    assert_eq!(family("denorm_command_documents_bucket"), Some("denorm_command_documents"));
    assert_eq!(family("denorm_commands_total_bucket"), None, "not a histogram");
    assert_eq!(family("denorm_nope"), None);
}

#[test]
fn prometheus_scrapes_both_workers_on_the_default_metrics_port() {
    let prom = read("deploy/prometheus.yml");
    let compose = read("docker-compose.yml");
    for worker in ["worker-1", "worker-2"] {
        assert!(prom.contains(&format!("{worker}:9464")), "prometheus.yml does not scrape {worker}");
        assert!(compose.contains(&format!("\n  {worker}:")), "docker-compose.yml has no service {worker}");
    }
    assert!(compose.contains("DENORM_METRICS_ADDR: 0.0.0.0:9464"));
}

#[test]
fn the_chart_ships_the_same_dashboard() {
    assert_eq!(
        read("helm/denorm/dashboards/denorm.json"),
        read("deploy/grafana/dashboards/denorm.json"),
        "helm/denorm/dashboards/denorm.json is a copy of deploy/grafana/dashboards/denorm.json: copy it again"
    );
}

#[test]
fn chart_alerts_name_exported_metrics() {
    let rules = read("helm/denorm/templates/prometheusrule.yaml");
    let exprs: Vec<&str> = rules.lines().filter_map(|l| l.trim().strip_prefix("expr: ")).collect();
    assert_eq!(exprs.len(), rules.matches("- alert: ").count(), "one expression per alert");
    assert_eq!(exprs.len(), 15, "the alerts of docs/kubernetes.md");
    let mut used = BTreeSet::new();
    for expr in exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "alert queries no denorm metric: {expr}");
        for n in names {
            used.insert(family(&n).unwrap_or_else(|| panic!("an alert queries {n}, which denorm does not export")));
        }
    }
    for needed in [
        "denorm_consumer_lag_seconds",
        "denorm_parked_keys",
        "denorm_degraded_partitions",
        "denorm_dead_letters_total",
        "denorm_consumer_assigned_partitions",
        "denorm_moves_in_flight",
        "denorm_owner_conflicts",
        "denorm_owner_conflicts_total",
        "denorm_consumer_rebalance_seconds",
        "denorm_consumer_offset_commit_failures_total",
        "denorm_partition_oldest_unfinished_seconds",
        "denorm_partition_waiting_commands",
        "denorm_verify_differences",
        "denorm_verify_last_clean_timestamp_seconds",
    ] {
        assert!(used.contains(needed), "no alert on {needed}");
    }
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces to `-`.
fn anchor(heading: &str) -> String {
    heading.trim().to_lowercase().chars().filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_').map(|c| if c == ' ' { '-' } else { c }).collect()
}

#[test]
fn documentation_links_resolve() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![root.join("README.md"), root.join("helm/denorm/README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            pages.push(p);
        }
    }
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let target = &rest[..rest.find(')').unwrap()];
            if target.starts_with("http") || target.contains(' ') {
                continue;
            }
            let (file, frag) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() { page.clone() } else { page.parent().unwrap().join(file) };
            assert!(path.exists(), "{}: link to {target}: no such file", page.display());
            if !frag.is_empty() {
                let body = std::fs::read_to_string(&path).unwrap();
                let anchors: Vec<String> = body.lines().filter(|l| l.starts_with('#')).map(|l| anchor(l.trim_start_matches('#'))).collect();
                assert!(anchors.iter().any(|a| a == frag), "{}: link to {target}: no heading with that anchor", page.display());
            }
            checked += 1;
        }
    }
    assert!(checked > 30, "only {checked} links found");
}

#[test]
fn anchors_follow_github() {
    assert_eq!(anchor(" What is verified here"), "what-is-verified-here");
    assert_eq!(anchor(" 4. Framing: two choices"), "4-framing-two-choices");
    assert_eq!(anchor(" DenormLagHigh"), "denormlaghigh");
}
