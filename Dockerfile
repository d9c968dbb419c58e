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
# CUDA (not built or run here: this machine has no Docker engine and no GPU).
# Debian's libtorch is CPU-only, so give a cxx11-ABI CUDA libtorch archive and
# the CUDA version it was built for; the build stage installs that version's
# toolkit and NCCL from NVIDIA's Debian 12 repository (libtorch's CMake config
# needs nvcc and the CUDA headers), checks that the archive was built for it,
# and builds with TXL_NCCL=ON (train/CMakeLists.txt: no quiet fallback to Gloo).
# The runtime stage carries libtorch's libraries, which bundle the CUDA
# runtime; the driver comes from the host's container toolkit.
#   docker build --build-arg CUDA_VERSION=12.4 \
#     --build-arg LIBTORCH_URL=https://download.pytorch.org/libtorch/cu124/libtorch-cxx11-abi-shared-with-deps-2.4.1%2Bcu124.zip \
#     -t txl-serve:cuda .
#   docker run --gpus all txl-serve:cuda --device cuda

ARG DEBIAN=debian:12

FROM ${DEBIAN} AS build
ARG LIBTORCH_URL=
ARG CUDA_VERSION=
WORKDIR /src
COPY . .
RUN scripts/install-deps.sh
# A downloaded libtorch 2.x carries an old Protocol Buffers' headers (include/google), which would
# shadow Debian's that gRPC's generated code needs (docs/GPU.md): they are removed.
RUN if [ -n "$LIBTORCH_URL" ]; then \
      apt-get install -y -qq --no-install-recommends curl unzip ca-certificates && \
      curl -fsSL "$LIBTORCH_URL" -o /tmp/libtorch.zip && unzip -q /tmp/libtorch.zip -d /opt && \
      rm /tmp/libtorch.zip && rm -rf /opt/libtorch/include/google; \
    else mkdir -p /opt/libtorch/lib; fi
# A CUDA libtorch: the toolkit of its own CUDA version, or a clear failure.
RUN if [ -n "$LIBTORCH_URL" ] && grep -q "+cu" /opt/libtorch/build-version; then \
      built=$(sed -n 's/.*+cu\([0-9]*\).*/\1/p' /opt/libtorch/build-version); \
      if [ -z "$CUDA_VERSION" ] || [ "$built" != "$(echo "$CUDA_VERSION" | tr -d .)" ]; then \
        echo "Dockerfile: libtorch $(cat /opt/libtorch/build-version) needs --build-arg CUDA_VERSION for cu$built" >&2; \
        exit 1; \
      fi; \
      curl -fsSL -o /tmp/keyring.deb \
        https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb && \
      dpkg -i /tmp/keyring.deb && rm /tmp/keyring.deb && apt-get update -qq && \
      apt-get install -y -qq --no-install-recommends "cuda-toolkit-$(echo "$CUDA_VERSION" | tr . -)" libnccl-dev && \
      echo "-DCMAKE_PREFIX_PATH=/opt/libtorch -DCUDAToolkit_ROOT=/usr/local/cuda -DTXL_NCCL=ON" > /tmp/cmake-args; \
    elif [ -n "$LIBTORCH_URL" ]; then echo "-DCMAKE_PREFIX_PATH=/opt/libtorch" > /tmp/cmake-args; \
    else : > /tmp/cmake-args; fi
RUN PATH=/usr/local/cuda/bin:$PATH CMAKE_ARGS="$(cat /tmp/cmake-args)" scripts/build.sh
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
