"""A proxyless gRPC client (grpcio, C-core) for tests/it/proxyless.rs.

It opens a channel to the xds: target given as its argument, so the client subscribes to LDS,
RDS, CDS and EDS through the server in GRPC_XDS_BOOTSTRAP (the tap), and serves its own CSDS on
a loopback port, which it prints as its first line. It runs until its standard input closes.
"""

import sys
from concurrent import futures

import grpc
import grpc_csds


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    grpc_csds.add_csds_servicer(server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(sys.argv[1])
    channel.subscribe(lambda _state: None, try_to_connect=True)
    print(port, flush=True)
    sys.stdin.read()
    channel.close()
    server.stop(None)


if __name__ == "__main__":
    main()
