//! The encoders against each other and against the `prometheus` crate,
//! and the renderer's reuse.

use super::renderer::{ExtraIds, SampleKey, MAX_EXTRAS, RUN};
use super::*;
use crate::deflate::Piece;
use crate::inventory::tests::volume;
use crate::inventory::Inventory;

#[test]
fn per_volume_series_carry_exactly_the_three_labels_escaped() {
    let inv = Inventory::for_tests(vec![volume("ns\"1", "pool\\a", 7)]);
    let mut f = Family::gauge("nomad_host_volume_x_bytes", "An \\ example.\nSecond line.");
    f.volume(0, 5.0);
    f.volume_with(0, &[("reason", "timeout")], 1.0);
    let text = encode_all(&[f], &inv);
    let id = &inv.volumes[0].volume_id;
    assert_eq!(
        text,
        format!(
            "# HELP nomad_host_volume_x_bytes An \\\\ example.\\nSecond line.\n\
             # TYPE nomad_host_volume_x_bytes gauge\n\
             nomad_host_volume_x_bytes{{namespace=\"ns\\\"1\",node_pool=\"pool\\\\a\",volume_id=\"{id}\"}} 5\n\
             nomad_host_volume_x_bytes{{namespace=\"ns\\\"1\",node_pool=\"pool\\\\a\",volume_id=\"{id}\",reason=\"timeout\"}} 1\n"
        )
    );
}

#[test]
fn large_families_keep_one_header() {
    let vols = (0..2500)
        .map(|i| volume("default", "default", 100 + i))
        .collect();
    let inv = Inventory::for_tests(vols);
    let mut f = Family::counter("nomad_host_volume_y_total", "Y.");
    for i in 0..inv.volumes.len() {
        f.volume(i, i as f64);
    }
    let text = encode_all(&[f], &inv);
    assert_eq!(text.matches("# HELP").count(), 1);
    assert_eq!(
        text.matches("# TYPE nomad_host_volume_y_total counter")
            .count(),
        1
    );
    assert_eq!(text.lines().count(), 2 + 2500);
    assert!(text.ends_with(" 2499\n"));
}

#[test]
fn empty_families_write_nothing() {
    let inv = Inventory::for_tests(vec![]);
    let f = Family::gauge("a", "b");
    assert_eq!(encode_all(&[f], &inv), "");
}

#[test]
fn values_are_written_as_prometheus_parses_them() {
    let text = |v: f64| {
        let mut out = Vec::new();
        value(&mut out, v);
        String::from_utf8(out).unwrap()
    };
    assert_eq!(text(0.0), "0");
    assert_eq!(text(-0.0), "-0");
    assert_eq!(text(5.0), "5");
    assert_eq!(text(-3.0), "-3");
    assert_eq!(text(1_073_741_824.0), "1073741824");
    assert_eq!(text(9_007_199_254_740_991.0), "9007199254740991");
    assert_eq!(text(0.25), "0.25");
    assert_eq!(text(f64::NAN), "NaN");
    assert_eq!(text(f64::INFINITY), "+Inf");
    assert_eq!(text(f64::NEG_INFINITY), "-Inf");
    for v in [
        1e300,
        2f64.powi(60),
        0.001_234,
        1.5e-9,
        18_446_744_073_709_551_615.0,
    ] {
        assert_eq!(text(v).parse::<f64>().unwrap(), v, "{v}");
    }
}

#[test]
fn escaping_follows_the_exposition_format() {
    let esc = |s: &str, quote: bool| {
        let mut out = Vec::new();
        escape(&mut out, s, quote);
        String::from_utf8(out).unwrap()
    };
    assert_eq!(esc("plain", true), "plain");
    assert_eq!(esc("a\\b\"c\nd", true), "a\\\\b\\\"c\\nd");
    assert_eq!(esc("a\\b\"c\nd", false), "a\\\\b\"c\\nd");
    assert_eq!(esc("ünïcödé\n", true), "ünïcödé\\n");
}

/// Families like a real scrape's: per-volume gauges and counters, extra
/// labels, the info family, unlabelled and owned-label self metrics.
fn scrape_like(inv: &Inventory) -> Vec<Family> {
    let n = inv.volumes.len();
    let mut fams = Vec::new();
    let mut info = Family::gauge("nomad_host_volume_info", "Info.");
    for i in 0..n {
        info.info(i);
    }
    fams.push(info);
    for k in 0..13 {
        let name: &'static str = Box::leak(format!("nomad_host_volume_g{k}_bytes").into());
        let mut f = Family::gauge(name, "A per-volume gauge \\ with\nHELP to escape.");
        for i in 0..n {
            f.volume(i, (i as f64) * 4096.0 * (k + 1) as f64);
        }
        fams.push(f);
    }
    let mut errors = Family::counter("nomad_host_volume_write_errors_total", "Errors.");
    let mut hits = Family::counter("nomad_host_volume_quota_limit_hits_total", "Hits.");
    // One set per errno, as the collectors' `&'static` sets are.
    let errnos: Vec<Extra> = ["ENOSPC", "EDQUOT", "EIO", "EROFS", "other"]
        .into_iter()
        .map(|e| -> Extra { Box::leak(Box::new([("errno", e)])) })
        .collect();
    for i in 0..n {
        for &extra in &errnos {
            errors.volume_with(i, extra, (i % 3) as f64);
        }
        hits.volume_with(i, &[("resource", "bytes"), ("limit", "hard")], 0.0);
    }
    fams.push(errors);
    fams.push(hits);
    let mut durations = Family::gauge("prjquota_exporter_scrape_collector_duration_seconds", "D.");
    for (c, v) in [("registry", 0.012_345), ("statfs", 1.5), ("quota", 1e-7)] {
        durations.labelled(vec![("collector", c.to_string())], v);
    }
    fams.push(durations);
    let mut plain = Family::gauge("prjquota_exporter_volumes", "");
    plain.plain(n as f64);
    fams.push(plain);
    fams
}

fn inventory(n: u32) -> Inventory {
    let mut vols: Vec<_> = (0..n)
        .map(|i| volume(&format!("ns-{}", i % 7), "default", 1000 + i))
        .collect();
    if let Some(v) = vols.first_mut() {
        v.namespace = "we\"ird\\ns\nx".into();
        v.volume_name = "name \"quoted\"".into();
    }
    Inventory::for_tests(vols)
}

/// The `prometheus` crate's `TextEncoder`, fed `proto::Metric`s as this
/// module did before it wrote the format itself: the reference output.
mod reference {
    use super::super::*;
    use crate::inventory::Inventory;
    use prometheus::proto::{self, MetricType};
    use prometheus::{Encoder as _, TextEncoder};

    /// Samples per `MetricFamily` of the old batched encoding.
    const BATCH: usize = 1024;

    fn metric(f: &Family, inventory: &Inventory, s: &Sample) -> proto::Metric {
        let mut m = proto::Metric::default();
        let mut labels = Vec::new();
        let mut push = |name: &str, value: &str| {
            let mut lp = proto::LabelPair::default();
            lp.set_name(name.to_string());
            lp.set_value(value.to_string());
            labels.push(lp);
        };
        match &s.labels {
            Labels::None => {}
            Labels::Volume { index, extra } => {
                let v = &inventory.volumes[*index as usize];
                push("namespace", &v.namespace);
                push("node_pool", &v.node_pool);
                push("volume_id", &v.volume_id);
                for (k, val) in extra.iter() {
                    push(k, val);
                }
            }
            Labels::VolumeInfo { index } => {
                let v = &inventory.volumes[*index as usize];
                push("namespace", &v.namespace);
                push("node_pool", &v.node_pool);
                push("volume_id", &v.volume_id);
                push("volume_name", &v.volume_name);
                push("node_id", &v.node_id);
                push("plugin_id", &v.plugin_id);
                push("fstype", &v.fstype);
                push("project_id", &v.project_id.to_string());
                if v.excluded_from_alerts {
                    push("excluded_from_alerts", "true");
                }
            }
            Labels::Owned(pairs) => {
                for (k, val) in pairs.iter() {
                    push(k, val);
                }
            }
            Labels::Shared(shared) => {
                let SharedLabel { name, value, extra } = &**shared;
                push(name, value);
                for (k, val) in extra.iter() {
                    push(k, val);
                }
            }
        }
        m.set_label(labels);
        match f.kind {
            Kind::Gauge | Kind::Info => {
                let mut g = proto::Gauge::default();
                g.set_value(s.value);
                m.set_gauge(g);
            }
            Kind::Counter => {
                let mut c = proto::Counter::default();
                c.set_value(s.value);
                m.set_counter(c);
            }
        }
        m
    }

    /// The old batched encoding: one `MetricFamily` per batch, the
    /// repeated `# TYPE` line of later batches cut.
    pub fn encode_all(families: &[Family], inventory: &Inventory) -> String {
        let mut out = Vec::new();
        for f in families {
            for (b, chunk) in f.samples.chunks(BATCH).enumerate() {
                let mut mf = proto::MetricFamily::default();
                mf.set_name(f.name.to_string());
                mf.set_field_type(match f.kind {
                    Kind::Gauge | Kind::Info => MetricType::GAUGE,
                    Kind::Counter => MetricType::COUNTER,
                });
                if b == 0 {
                    mf.set_help(f.help.to_string());
                }
                let metrics = mf.mut_metric();
                metrics.reserve_exact(chunk.len());
                for s in chunk {
                    metrics.push(metric(f, inventory, s));
                }
                let start = out.len();
                TextEncoder::new()
                    .encode(std::slice::from_ref(&mf), &mut out)
                    .unwrap();
                if b > 0 {
                    let nl = out[start..].iter().position(|&c| c == b'\n').unwrap() + 1;
                    out.drain(start..start + nl);
                }
            }
        }
        String::from_utf8(out).unwrap()
    }
}

#[test]
fn same_text_as_the_prometheus_crate() {
    let inv = inventory(2100); // three batches per family
    let fams = scrape_like(&inv);
    let ours = encode_all(&fams, &inv);
    let theirs = reference::encode_all(&fams, &inv);
    assert_eq!(ours.len(), theirs.len());
    for (n, (a, b)) in ours.lines().zip(theirs.lines()).enumerate() {
        assert_eq!(a, b, "line {}", n + 1);
    }
    assert_eq!(ours, theirs);
}

/// The text of a render, inflated if it was kept compressed.
fn joined(r: &Rendered) -> String {
    String::from_utf8(r.text().unwrap().concat()).unwrap()
}

/// Whether two renders' pieces are the same memory, piece by piece.
fn shared(a: &Rendered, b: &Rendered) -> Vec<bool> {
    a.pieces
        .iter()
        .zip(&b.pieces)
        .map(|(x, y)| (x.bytes.as_ptr(), x.bytes.len()) == (y.bytes.as_ptr(), y.bytes.len()))
        .collect()
}

/// Both ways of keeping the text.
fn renderers() -> [Renderer; 2] {
    [Renderer::new(), Renderer::compressed()]
}

#[test]
fn the_renderer_writes_what_encode_all_writes_scrape_after_scrape() {
    use std::sync::Arc;
    for mut r in renderers() {
        let first = Arc::new(inventory(2100));
        let fams = scrape_like(&first);
        assert_eq!(joined(&r.render(&first, &fams)), encode_all(&fams, &first));

        // The same volumes (the registry's Arcs), one value changed, one
        // volume gone, one new, a changed record (a new Arc) for another.
        let mut vols = first.volumes.clone();
        vols.remove(5);
        let mut changed = (*vols[7]).clone();
        changed.namespace = "moved".into();
        vols[7] = Arc::new(changed);
        vols.push(Arc::new(crate::inventory::tests::volume("new", "p", 9999)));
        let second = Arc::new(Inventory::new(first.dirs.clone(), vols));
        let mut fams = scrape_like(&second);
        fams[3].samples[11].value = 123.0;
        let text = joined(&r.render(&second, &fams));
        assert_eq!(text, encode_all(&fams, &second));
        assert!(text.contains("namespace=\"moved\""));
        // And once more unchanged.
        assert_eq!(
            joined(&r.render(&second, &fams)),
            encode_all(&fams, &second)
        );
    }
}

#[test]
fn compressed_runs_hold_a_fraction_of_the_text() {
    use std::sync::Arc;
    let inv = Arc::new(inventory(2100));
    let fams = scrape_like(&inv);
    let r = Renderer::compressed().render(&inv, &fams);
    let kept: usize = r.pieces.iter().map(|p| p.bytes.len()).sum();
    let text = r.text_len() as usize;
    assert_eq!(text, encode_all(&fams, &inv).len());
    assert!(kept * 5 < text, "{text} bytes of text kept in {kept}");
}

#[test]
fn an_unchanged_family_is_reused_without_a_copy() {
    use std::sync::Arc;
    for mut r in renderers() {
        let inv = Arc::new(inventory(50));
        let fams = scrape_like(&inv);
        let a = r.render(&inv, &fams);
        let mut changed = fams.clone();
        changed[2].samples[0].value = -1.0;
        let b = r.render(&inv, &changed);
        assert_eq!(a.pieces.len(), b.pieces.len());
        // Every per-volume family but the changed one is the same memory;
        // self metrics are written afresh.
        let mut extras = ExtraIds::default();
        let per_volume = fams
            .iter()
            .filter(|f| SampleKey::of(&inv, &mut extras, &f.samples[0]).is_some())
            .count();
        let same = shared(&a, &b).into_iter().filter(|&s| s).count();
        assert_eq!(same, per_volume - 1, "{} pieces", a.pieces.len());
        assert_eq!(joined(&b), encode_all(&changed, &inv));
    }
}

#[test]
fn a_changed_value_rewrites_only_its_run() {
    use std::sync::Arc;
    for mut r in renderers() {
        let inv = Arc::new(inventory(2100)); // nine runs per family
        let fams = scrape_like(&inv);
        let a = r.render(&inv, &fams);
        let mut changed = fams.clone();
        changed[2].samples[1000].value = -1.0;
        let b = r.render(&inv, &changed);
        assert_eq!(joined(&b), encode_all(&changed, &inv));
        assert_eq!(a.pieces.len(), b.pieces.len());
        // Of the runs, only the changed one is new; the loose pieces
        // (self metrics) are written afresh every time.
        let text = |p: &Piece| joined(&Rendered::new(vec![p.clone()], b.compressed));
        let fresh: Vec<String> = shared(&a, &b)
            .into_iter()
            .zip(&b.pieces)
            .filter(|(same, _)| !same)
            .map(|(_, p)| text(p))
            .filter(|t| t.contains("volume_id="))
            .collect();
        assert_eq!(fresh.len(), 1);
        let run = &fresh[0];
        assert_eq!(run.lines().count(), RUN);
        assert!(run.contains("} -1\n"));
    }
}

#[test]
fn a_run_stays_cached_when_its_volumes_move_in_the_inventory() {
    use std::sync::Arc;
    for mut r in renderers() {
        let first = Arc::new(inventory(30));
        let sparse = |inv: &Inventory| {
            let mut f = Family::counter("nomad_host_volume_sparse_total", "S.");
            for (i, v) in inv.volumes.iter().enumerate() {
                if v.project_id % 10 == 5 {
                    f.volume(i, 7.0);
                }
            }
            vec![f]
        };
        let a = r.render(&first, &sparse(&first));
        // Volume 0 gone: the others' indices drop by one, their lines not.
        let second = Arc::new(Inventory::new(
            first.dirs.clone(),
            first.volumes[1..].to_vec(),
        ));
        let fams = sparse(&second);
        let b = r.render(&second, &fams);
        let c = r.render(&second, &fams);
        assert_eq!(joined(&c), encode_all(&fams, &second));
        assert_eq!(shared(&a, &b), [true]);
        assert_eq!(shared(&b, &c), [true]);
    }
}

#[test]
fn extra_labels_made_per_scrape_reset_the_cache_and_stay_right() {
    use std::sync::Arc;
    let inv = Arc::new(inventory(MAX_EXTRAS as u32 + 10));
    let leaky = || {
        let mut f = Family::counter("nomad_host_volume_leaky_total", "L.");
        for i in 0..inv.volumes.len() {
            let extra: Extra = Box::leak(Box::new([("errno", "EIO")]));
            f.volume_with(i, extra, 1.0);
        }
        vec![f]
    };
    for mut r in renderers() {
        for _ in 0..3 {
            let fams = leaky();
            assert_eq!(joined(&r.render(&inv, &fams)), encode_all(&fams, &inv));
            assert!(r.extras.len() <= 2 * (MAX_EXTRAS + 10));
        }
    }
}

/// OpenMetrics through the renderer: what `encode_all_as` writes, scrape
/// after scrape, with a changed `_created` rewriting its run; the text
/// renderer writes the same text as before for the same families.
#[test]
fn openmetrics_runs_follow_their_created_times() {
    use std::sync::Arc;
    let inv = Arc::new(inventory(700));
    let mut fams = scrape_like(&inv);
    fams[0].kind = Kind::Info;
    // The write errors with their own creation times; the quota hits
    // get the default.
    let errors = fams
        .iter()
        .position(|f| f.name == "nomad_host_volume_write_errors_total")
        .unwrap();
    let n = fams[errors].samples.len();
    fams[errors].created = (0..n).map(|i| 1.7e9 + i as f64 / 8.0).collect();
    let om = |fams: &[Family]| {
        encode_all_as(
            Format::OpenMetrics,
            Created::On { since: Some(1.6e9) },
            fams,
            &inv,
        )
    };
    for base in renderers() {
        let mut r = base.with_format(Format::OpenMetrics, Created::On { since: Some(1.6e9) });
        let first = joined(&r.render(&inv, &fams));
        assert_eq!(first, om(&fams));
        assert!(first.ends_with("\n# EOF\n"));
        assert!(first.contains("# TYPE nomad_host_volume info\n"));
        assert!(first.contains("# TYPE nomad_host_volume_write_errors counter\n"));
        assert!(first.contains(
            "# HELP nomad_host_volume_g0_bytes A per-volume gauge \\\\ with\\nHELP to escape.\n"
        ));
        assert_eq!(
            first
                .matches("nomad_host_volume_write_errors_created{")
                .count(),
            n
        );
        assert!(first.contains("nomad_host_volume_quota_limit_hits_created{"));
        assert!(first.contains("} 1600000000\n"));
        // A real OpenMetrics parser reads it, escapes and all.
        let parsed = prjquota_vmtests::prom::openmetrics_parse(&first)
            .unwrap_or_else(|e| panic!("not OpenMetrics: {e}"));
        let ns = &parsed
            .iter()
            .find(|f| f.name == "nomad_host_volume")
            .unwrap()
            .samples[0]
            .1;
        assert_eq!(ns["namespace"], "we\"ird\\ns\nx");
        let mut changed = fams.clone();
        changed[errors].created[n - 1] = 1.8e9;
        let a = r.render(&inv, &changed);
        assert_eq!(joined(&a), om(&changed));
        assert!(joined(&a).contains("} 1800000000\n"));
        let b = r.render(&inv, &changed);
        assert_eq!(
            shared(&a, &b).iter().filter(|s| !**s).count(),
            1,
            "only the self metrics are new"
        );
    }
    // The text format ignores created times and the info type.
    let mut text = Renderer::new();
    assert_eq!(joined(&text.render(&inv, &fams)), encode_all(&fams, &inv));
    let mut plain = fams.clone();
    plain[0].kind = Kind::Gauge;
    plain[errors].created.clear();
    assert_eq!(encode_all(&fams, &inv), encode_all(&plain, &inv));
}

/// Time to encode a 10,000-volume scrape with the `prometheus` crate's
/// `TextEncoder` (as this module did before) and with [`Encoder`].
/// `cargo test -p prjquota-exporter --release --lib encoder_speed -- --ignored --nocapture`
#[test]
#[ignore = "a measurement, not a test: run it on purpose"]
fn encoder_speed() {
    use std::time::Instant;
    let inv = inventory(10_000);
    let fams = scrape_like(&inv);
    let samples: usize = fams.iter().map(|f| f.samples.len()).sum();
    let time = |f: &dyn Fn() -> usize| {
        let mut best = f64::MAX;
        let mut bytes = 0;
        for _ in 0..5 {
            let t = Instant::now();
            bytes = f();
            best = best.min(t.elapsed().as_secs_f64());
        }
        (best, bytes)
    };
    let (old, old_bytes) = time(&|| reference::encode_all(&fams, &inv).len());
    let (new, new_bytes) = time(&|| encode_all(&fams, &inv).len());
    assert_eq!(old_bytes, new_bytes);
    eprintln!(
        "MEASURE encode_10k_volumes samples={samples} bytes={new_bytes} \
         prometheus_crate_seconds={old:.4} direct_seconds={new:.4} ratio={:.1}",
        old / new
    );
}
