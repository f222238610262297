# glance in a container: `docker build -t glance .`, then `docker run -p 8000:8000 glance`.
# Several replicas behind nginx: deploy/compose.yaml (docs/serve.md, "Beyond one machine").

# Build: the release binary, which embeds glance-tiny (with its draft heads) and glance-tiny-dvlm.
FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p glance \
 && strip target/release/glance

# Run: the binary alone on slim Debian (same glibc as the build), as an unprivileged user whose
# home is the glance home (the shipped models are installed there on first use).
FROM debian:bookworm-slim
RUN useradd --system --create-home --home-dir /var/lib/glance glance
COPY --from=build /src/target/release/glance /usr/local/bin/glance
USER glance
ENV GLANCE_HOME=/var/lib/glance
WORKDIR /var/lib/glance
EXPOSE 8000
ENTRYPOINT ["glance"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
