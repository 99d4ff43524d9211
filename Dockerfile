FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --bin fastack

FROM debian:bookworm-slim
# curl: the compose healthcheck probes /readyz with it.
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/fastack /usr/local/bin/fastack
EXPOSE 8080 8081
ENTRYPOINT ["fastack"]
CMD ["serve"]
