# syntax=docker/dockerfile:1
# The hyrec image: every role (`hyrec ps|loader|worker|...`) under /opt/hyrec/bin, as the rendered
# manifests run it (include/hyrec/job/k8s.h, docs/deploy-gke.md). The build stage runs the
# project's own scripts (tools/deps.sh installs the Debian packages, tools/build.sh builds), the
# same ones `tools/test` runs on a fresh machine; the runtime stage holds the installed tree, the
# shared libraries it needs and a non-root user.
#
#   docker build -t REPO/hyrec:VERSION .
#   docker push REPO/hyrec:VERSION          # then render with --image=REPO/hyrec@sha256:<digest>
#
# The CUDA variant (GPU workers, NCCL) builds against a CUDA LibTorch instead of Debian's CPU one;
# docs/deploy-gke.md "GPU image" has the steps.

FROM debian:12 AS build
WORKDIR /src
COPY tools/ tools/
RUN bash tools/deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
# Only what the image runs: no tests, no benchmarks.
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DHYREC_BUILD_TESTS=OFF -DHYREC_BUILD_BENCHMARKS=OFF \
 && HYREC_BUILD_DIR=build bash tools/build.sh \
 && cmake --install build --prefix /opt/hyrec

FROM debian:12-slim AS runtime
COPY tools/deps.sh /tmp/deps.sh
RUN bash -c 'source /tmp/deps.sh && hyrec_install_runtime_debs' && rm -rf /var/lib/apt/lists/* /tmp/deps.sh
COPY --from=build /opt/hyrec /opt/hyrec
RUN groupadd --gid 10001 hyrec && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin hyrec
USER 10001:10001
ENV PATH=/opt/hyrec/bin:$PATH
ENTRYPOINT ["/opt/hyrec/bin/hyrec"]
CMD ["--help"]
