# syntax=docker/dockerfile:1
# Build stage: the release binary (librdkafka is built from source by rdkafka-sys).
FROM rust:1-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends cmake && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY schemas ./schemas
RUN cargo build --release --locked --bin denorm

# Runtime stage: a slim image, non-root user.
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --create-home --home-dir /home/denorm denorm
COPY --from=build /src/target/release/denorm /usr/local/bin/denorm
USER denorm
WORKDIR /home/denorm
ENTRYPOINT ["denorm"]
CMD ["--help"]
