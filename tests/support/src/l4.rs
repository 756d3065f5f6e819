//! The benches' L4 relay column: the cheapest relay that touches every byte (tokio's
//! `copy_bidirectional`, 256 KiB buffers, one thread, a listen backlog of 4096). A bench binary
//! becomes this relay when its environment names `"LISTEN UPSTREAM"`, so the relay is a
//! process of its own, measured as the proxies are.

use tokio::net::TcpStream;

/// Relays every connection to `LISTEN` (the first word of `spec`) to `UPSTREAM` (the second),
/// until killed.
pub fn relay(spec: &str) -> ! {
    let (listen_at, upstream) = spec.split_once(' ').unwrap();
    let (listen_at, upstream) = (listen_at.to_string(), upstream.to_string());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        socket.bind(listen_at.parse().unwrap()).unwrap();
        let listener = socket.listen(4096).unwrap();
        loop {
            let (mut down, _) = listener.accept().await.unwrap();
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let _ = down.set_nodelay(true);
                let Ok(mut up) = TcpStream::connect(&upstream).await else {
                    return;
                };
                let _ = up.set_nodelay(true);
                let buf = 256 << 10;
                let _ =
                    tokio::io::copy_bidirectional_with_sizes(&mut down, &mut up, buf, buf).await;
            });
        }
    });
    std::process::exit(0)
}
