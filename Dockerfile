# txl-serve container: build stage, then a slim runtime stage that runs as a
# non-root user. Every step is one of the scripts CI runs (.ci/run ->
# scripts/test.sh -> install-deps.sh + build.sh), and
# tests/integration/test_container.py replays the install and the health check
# so that CI proves them.
#
#   docker build -t txl-serve .
#   docker run -p 50051:50051 -p 9464:9464 txl-serve                     # the bundled model
#   docker run -v $PWD/m.pt:/models/m.pt:ro txl-serve --model /models/m.pt  # a mounted one
#
# CUDA (not built or run here: this machine has no Docker engine and no GPU):
# Debian's libtorch is CPU-only, so give a cxx11-ABI CUDA libtorch archive;
# the build finds it first and the runtime stage carries its libraries (it
# bundles the CUDA runtime; the driver comes from the host's container toolkit).
#   docker build --build-arg LIBTORCH_URL=https://.../libtorch-cxx11-abi-shared-with-deps-...%2Bcu121.zip \
#     -t txl-serve:cuda .
#   docker run --gpus all txl-serve:cuda --device cuda

ARG DEBIAN=debian:12

FROM ${DEBIAN} AS build
ARG LIBTORCH_URL=
WORKDIR /src
COPY . .
RUN scripts/install-deps.sh
RUN if [ -n "$LIBTORCH_URL" ]; then \
      apt-get install -y -qq --no-install-recommends curl unzip ca-certificates && \
      curl -fsSL "$LIBTORCH_URL" -o /tmp/libtorch.zip && unzip -q /tmp/libtorch.zip -d /opt && \
      rm /tmp/libtorch.zip; \
    else mkdir -p /opt/libtorch/lib; fi
RUN CMAKE_ARGS="$([ -n "$LIBTORCH_URL" ] && echo -DCMAKE_PREFIX_PATH=/opt/libtorch)" scripts/build.sh
RUN cmake --install build --prefix /opt/txl-serve

FROM ${DEBIAN}-slim AS runtime
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN /tmp/install-deps.sh --runtime && rm -rf /var/lib/apt/lists/* /tmp/install-deps.sh
# Empty unless the build used a downloaded (CUDA) libtorch.
COPY --from=build /opt/libtorch/lib /opt/libtorch/lib
ENV LD_LIBRARY_PATH=/opt/libtorch/lib
# Idle OpenMP workers sleep instead of spinning: spinning made engine steps
# ~10x slower when the container's cores are shared (docs/PERFORMANCE.md).
ENV OMP_WAIT_POLICY=PASSIVE
COPY --from=build /opt/txl-serve /opt/txl-serve
RUN useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin txl
USER 10001
EXPOSE 50051 9464 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD ["/opt/txl-serve/bin/txl-client", "--server", "127.0.0.1:50051", "--timeout", "3", "health"]
# Without --model the installed server serves /opt/txl-serve/model/shakespeare_char.pt.
ENTRYPOINT ["/opt/txl-serve/bin/txl-server", "--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464", "--http_listen=0.0.0.0:8080"]
CMD []
