//! The NBD server fed arbitrary client bytes (handshake, options, requests, payloads) over an
//! in-memory pipe against a memory device: it must neither panic nor hang, and must answer
//! or close. The input is the client's whole side of the conversation.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use tagstripe::nbd::{NbdServer, ServerConfig};
use tagstripe::scheduler::IoClass;
use tagstripe::{BlockDevice, MemDevice};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::new("mem", 2048));
        let config = ServerConfig {
            max_request: 64 << 10,
            max_buffered: 1 << 20,
            max_in_flight: 8,
            ..ServerConfig::default()
        };
        let server = NbdServer::new(config).export("x", dev);
        let (client, conn) = tokio::io::duplex(1 << 16);
        let (mut rd, mut wr) = tokio::io::split(client);
        let input = data.to_vec();
        // Send everything, then close our side; drain the server's answers meanwhile.
        let writer = tokio::spawn(async move {
            let _ = wr.write_all(&input).await;
            let _ = wr.shutdown().await;
        });
        let reader = tokio::spawn(async move {
            let mut sink = vec![0u8; 1 << 16];
            while let Ok(n) = rd.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        });
        let served = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            server.serve_connection(conn, IoClass::BestEffort),
        )
        .await;
        assert!(served.is_ok(), "the server hung on this input");
        let _ = writer.await;
        let _ = reader.await;
    });
});
