# The epp image: `docker build -t ghcr.io/epp-rs/epp:0.1.0 .` from the repository root.
# The Helm chart (charts/inferencepool) runs ghcr.io/epp-rs/epp:<appVersion> by default;
# push the image under that name, or set inferenceExtension.image.{hub,name,tag}.
#
# Stage 1 builds the release binary (profile `dist`: release with whole-program LTO, a smaller
# resident footprint) with the locked dependency set (the workspace manifest
# names the e2e crate, so it is copied too; only the epp package is compiled).
FROM docker.io/library/rust:1.89-bookworm AS build
WORKDIR /src
# build.rs writes the embedded cl100k_base/o200k_base tables (src/request/bpe.rs).
COPY Cargo.toml Cargo.lock clippy.toml build.rs ./
# .cargo/config.toml compiles mimalloc with arenas committed on demand (lower peak RSS).
COPY .cargo ./.cargo
COPY src ./src
COPY e2e ./e2e
COPY config ./config
RUN cargo build --profile dist --locked -p epp --bin epp --bin epp-config --bin epp-pool-import \
 && install -D -t /out target/dist/epp target/dist/epp-config target/dist/epp-pool-import

# Stage 2: glibc and libgcc only, no shell, non-root (uid 65532). epp needs no files at run
# time: the tokenizer vocabularies are compiled in and its TLS certificate is generated in memory.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/epp /epp
# The configuration checker and the InferencePoolImport controller (docs/operations/pool-import.md),
# for a Deployment that sets `command: [/epp-pool-import]`.
COPY --from=build /out/epp-config /epp-config
COPY --from=build /out/epp-pool-import /epp-pool-import
# mimalloc gives freed pages back at once instead of after 10 ms: a 100K-token request's
# buffers are then gone before the next one's arrive (peak RSS on the 100-pod cost run
# 25-27 -> 21-24 MiB; small prompts' CPU unchanged, 100K prompts' about a fifth more;
# BENCHMARKS.md "Peak RSS: the poller's connections, tonic's buffer, the allocator's delay").
# mimalloc has no compile-time default for it, and epp forbids the
# unsafe call that sets it, so the image sets it; hack/bench.sh starts epp the same way.
ENV MIMALLOC_PURGE_DELAY=0
# ext_proc gRPC, gRPC health, Prometheus metrics.
EXPOSE 9002 9003 9090
USER 65532:65532
ENTRYPOINT ["/epp"]
