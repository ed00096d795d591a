//! The exporter under load and faults: many scrapers at once, volumes
//! coming and going mid-scrape, broken records, a volumes filesystem
//! unmounted under it. Every scrape must still answer 200 with a valid
//! exposition; memory must stay bounded.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prjquota_vmtests::fixture::{Fixture, MIB, XFS};
use prjquota_vmtests::nomad::{uuid, Spec};
use prjquota_vmtests::prom::{http_get, Exporter, Exposition};
use prjquota_vmtests::{scratch_dir, xfs_mount};

const VOLUME_ID: &str = "volume_id";

fn volume_ids(e: &Exposition) -> std::collections::BTreeSet<String> {
    e.find("nomad_host_volume_provisioned_bytes", &[])
        .filter_map(|s| s.label(VOLUME_ID).map(str::to_string))
        .collect()
}

#[test]
fn two_hundred_concurrent_scrapers_for_a_minute_all_get_answers() {
    let f = XFS.fixture("load");
    for i in 0..3 {
        f.create(&Spec::new(&format!("l{i}"), 16 * MIB as i64));
    }
    let exp = Exporter::start(&[&f.node.volumes_dir]);
    exp.scrape();
    let (_, rss_before) = exp.memory_kib();
    let ok = AtomicU64::new(0);
    let failed = std::sync::Mutex::new(Vec::new());
    let deadline = Instant::now() + Duration::from_secs(60);
    std::thread::scope(|s| {
        for _ in 0..200 {
            s.spawn(|| {
                let mut mine = 0;
                while Instant::now() < deadline || mine == 0 {
                    match http_get(exp.addr, "/metrics", Duration::from_secs(240)) {
                        Ok(r) if r.status == 200 && r.body.contains("nomad_host_volume_info") => {
                            mine += 1;
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(r) => failed.lock().unwrap().push(format!("status {}", r.status)),
                        Err(e) => failed.lock().unwrap().push(e.to_string()),
                    }
                }
            });
        }
    });
    let (hwm, rss_after) = exp.memory_kib();
    let failed = failed.into_inner().unwrap();
    eprintln!(
        "MEASURE exporter_200_scrapers_answers {} rss_before_kib {rss_before} rss_after_kib {rss_after} hwm_kib {hwm}",
        ok.load(Ordering::Relaxed)
    );
    assert!(
        failed.is_empty(),
        "{} failed scrapes, e.g. {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    // One scrape is served at a time, so load queues rather than piling up
    // memory; a leak per request would show over thousands of requests.
    assert!(rss_after < 128 * 1024, "RSS {rss_after} KiB after the load");
    let after = exp.scrape();
    assert_eq!(volume_ids(&after).len(), 3);
}

#[test]
fn volumes_created_and_deleted_while_scraping_never_break_a_scrape() {
    let f = XFS.fixture("churn");
    let keep = Spec::new("keep", 16 * MIB as i64);
    f.create(&keep);
    let exp = Exporter::start(&[&f.node.volumes_dir]);
    let done = AtomicBool::new(false);
    let scrapes = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let e = exp.scrape();
                assert!(
                    volume_ids(&e).contains(&keep.id),
                    "the stable volume vanished mid-churn"
                );
                scrapes.fetch_add(1, Ordering::Relaxed);
            }
        });
        for round in 0..6 {
            let specs: Vec<Spec> = (0..8)
                .map(|i| Spec::new(&format!("c{round}-{i}"), 4 * MIB as i64))
                .collect();
            std::thread::scope(|s2| {
                for sp in &specs {
                    s2.spawn(|| f.create(sp));
                }
            });
            std::thread::scope(|s2| {
                for sp in &specs {
                    s2.spawn(|| f.node.delete(sp).ok());
                }
            });
        }
        done.store(true, Ordering::Relaxed);
    });
    let end = exp.scrape();
    assert_eq!(volume_ids(&end), [keep.id.clone()].into_iter().collect());
    eprintln!("MEASURE churn_scrapes {}", scrapes.load(Ordering::Relaxed));
    assert!(scrapes.load(Ordering::Relaxed) > 0);
}

#[test]
fn corrupt_and_half_written_records_are_skipped_and_counted() {
    let f = XFS.fixture("corrupt");
    let good = Spec::new("good", 16 * MIB as i64);
    f.create(&good);
    let vols = f.node.volumes_dir.join(".prjquota/volumes");
    let rec = std::fs::read(vols.join(format!("{}.json", good.id))).unwrap();
    // Half of a real record, garbage, and a temp file of an interrupted write.
    std::fs::write(vols.join(format!("{}.json", uuid())), &rec[..rec.len() / 2]).unwrap();
    std::fs::write(vols.join(format!("{}.json", uuid())), [0xffu8, 0, 1, 2]).unwrap();
    std::fs::write(vols.join(format!(".{}.json.tmp", uuid())), b"{").unwrap();
    let exp = Exporter::start(&[&f.node.volumes_dir]);
    let e = exp.scrape();
    assert_eq!(volume_ids(&e), [good.id.clone()].into_iter().collect());
    let corrupt: f64 = e
        .find("prjquota_exporter_registry_corrupt_records", &[])
        .map(|s| s.value)
        .sum();
    assert_eq!(
        corrupt, 2.0,
        "the two broken records are counted; the temp file is not a record"
    );
}

#[test]
fn a_volumes_filesystem_unmounted_under_the_exporter_does_not_break_scrapes() {
    let base = scratch_dir(&xfs_mount(), "umount");
    let img = std::path::PathBuf::from(format!("/tmp/prjquota-umount-{}.img", std::process::id()));
    let mnt = base.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let sh = |c: &str| {
        let st = Command::new("bash").arg("-c").arg(c).status().unwrap();
        assert!(st.success(), "{c}");
    };
    sh(&format!(
        "truncate -s 320M {i} && mkfs.xfs -q {i} && mount -o loop,prjquota {i} {m}",
        i = img.display(),
        m = mnt.display()
    ));
    let doomed = Fixture::new(&mnt, "doomed");
    doomed.create(&Spec::new("doomed", 16 * MIB as i64));
    let healthy = XFS.fixture("healthy");
    let live = Spec::new("live", 16 * MIB as i64);
    healthy.create(&live);
    let exp = Exporter::start(&[&doomed.node.volumes_dir, &healthy.node.volumes_dir]);
    assert_eq!(volume_ids(&exp.scrape()).len(), 2);
    sh(&format!("umount -l {}", mnt.display()));
    for _ in 0..3 {
        let e = exp.scrape();
        assert!(
            volume_ids(&e).contains(&live.id),
            "the healthy filesystem's volume is still served"
        );
    }
    let _ = std::fs::remove_file(&img);
}
