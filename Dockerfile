# syntax=docker/dockerfile:1
# glance in a container: `docker build -t glance .`, then `docker run -p 8000:8000 glance`.
# Several replicas behind nginx: deploy/compose.yaml (docs/serve.md, "Beyond one machine").

# Build: the release binary, which embeds glance-tiny (with its draft heads) and glance-tiny-dvlm.
# The crates.io downloads and the target directory live in BuildKit cache mounts, so a rebuild
# after a source change compiles glance's own crates only (the binary is copied out of the mount).
FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p glance \
 && strip -o /glance target/release/glance

# Run: the binary alone on slim Debian (same glibc as the build), as an unprivileged user whose
# home is the glance home (the shipped models are installed there on first use).
FROM debian:bookworm-slim
RUN useradd --system --create-home --home-dir /var/lib/glance glance
COPY --from=build /glance /usr/local/bin/glance
USER glance
ENV GLANCE_HOME=/var/lib/glance
WORKDIR /var/lib/glance
EXPOSE 8000
# Liveness: GET /health (the image has no HTTP client; point the orchestrator's check at it).
ENTRYPOINT ["glance"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
