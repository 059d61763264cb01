//! Crash consistency: SIGKILL `tagstripe serve` during a stream of writes and flushes from
//! a client, restart it on the same files, and check that every write acknowledged before a
//! completed flush is intact. Several kill points, writes in flight at each.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tagstripe::nbd::NbdDevice;
use tagstripe::{BlockDevice, IoOpts};

fn serve(files: &[String]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tagstripe"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--export",
            "v",
            "--interleave",
            "16",
        ])
        .args(files)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut r = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap()
        .to_owned();
    std::thread::spawn(move || std::io::copy(&mut r, &mut std::io::sink()));
    (child, url)
}

fn pattern(i: u64) -> Vec<u8> {
    (0..4096u64)
        .map(|k| (k.wrapping_mul(7) ^ i.wrapping_mul(131)) as u8)
        .collect()
}

#[test]
fn acknowledged_and_flushed_writes_survive_sigkill() {
    let dir = std::env::temp_dir().join(format!("tagstripe-crash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let files: Vec<String> = [3u64, 4, 5]
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let p = dir.join(format!("c{i}.img"));
            std::fs::File::create(&p).unwrap().set_len(m << 20).unwrap();
            p.display().to_string()
        })
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Blocks written so far across runs: block i holds pattern(i) once acknowledged.
    let mut next_block = 0u64;
    for kill_after in [40u64, 300, 1000] {
        let (mut child, url) = serve(&files);
        let durable: Vec<u64> = rt.block_on(async {
            let c = Arc::new(NbdDevice::connect(&url).await.unwrap());
            let blocks = c.info().sectors / 8;
            let issued = Arc::new(AtomicU64::new(next_block));
            let acked = Arc::new(std::sync::Mutex::new(Vec::new()));
            let durable = Arc::new(std::sync::Mutex::new(Vec::new()));
            // 8 writers; every 32 acknowledged writes one of them flushes, and what was
            // acknowledged before that flush began becomes durable when it completes.
            let mut tasks = Vec::new();
            for _ in 0..8 {
                let (c, issued, acked, durable) = (
                    Arc::clone(&c),
                    Arc::clone(&issued),
                    Arc::clone(&acked),
                    Arc::clone(&durable),
                );
                tasks.push(tokio::spawn(async move {
                    loop {
                        let i = issued.fetch_add(1, Ordering::Relaxed);
                        let b = i % blocks;
                        if c.write(b * 8, Bytes::from(pattern(i)), IoOpts::new())
                            .await
                            .is_err()
                        {
                            return;
                        }
                        let snapshot = {
                            let mut a = acked.lock().unwrap();
                            a.push(i);
                            (a.len() % 32 == 0).then(|| a.clone())
                        };
                        if let Some(before) = snapshot {
                            if c.flush(IoOpts::new()).await.is_err() {
                                return;
                            }
                            let mut d = durable.lock().unwrap();
                            if before.len() > d.len() {
                                *d = before;
                            }
                        }
                    }
                }));
            }
            // The kill point: once enough writes are acknowledged and a flush has completed,
            // with writes (and maybe a flush) in flight.
            loop {
                if acked.lock().unwrap().len() as u64 >= kill_after
                    && !durable.lock().unwrap().is_empty()
                {
                    break;
                }
                tokio::task::yield_now().await;
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            child.kill().unwrap();
            child.wait().unwrap();
            for t in tasks {
                let _ = t.await;
            }
            next_block = issued.load(Ordering::Relaxed) + 8;
            durable.lock().unwrap().clone()
        });
        assert!(
            !durable.is_empty(),
            "no flush completed before the kill at {kill_after}"
        );
        // Restart on the same files and check every durable write.
        let (mut child, url) = serve(&files);
        rt.block_on(async {
            let c = NbdDevice::connect(&url).await.unwrap();
            let blocks = c.info().sectors / 8;
            for &i in &durable {
                // A later write to the same block (a wrap-around) would replace it; the
                // blocks here never wrap.
                assert!(i < blocks, "test too long for the volume");
                let got = c.read((i % blocks) * 8, 8, IoOpts::new()).await.unwrap();
                assert!(
                    got == pattern(i),
                    "write {i} lost after a SIGKILL at {kill_after}"
                );
            }
        });
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
