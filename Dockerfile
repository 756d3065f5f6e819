# Build stage: compile a release binary.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin xdstap

# Run stage: a small image with the binary only, running as a non-root user.
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home xdstap
COPY --from=build /src/target/release/xdstap /usr/local/bin/xdstap
USER 10001
EXPOSE 15010 9977
ENTRYPOINT ["/usr/local/bin/xdstap"]
CMD ["run", "--config", "/etc/xdstap/xdstap.yaml"]
