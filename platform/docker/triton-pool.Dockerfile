# The Triton image of a cluster pool's pods (KUBERNETES_POOL_TRITON_IMAGE, docs/pools.md#on-a-cluster).
#
# A pool serves every team's ONNX model (and a team pool's TorchScript and SavedModels) through Modelport's generated
# python-backend models, each in stub processes of its own that the pod confines to the model's memory limit
# (deployments/runtimes/kubernetes/pool_stub.py), instead of inside Triton's process: the stub runs them with the
# image's python3, which needs what the local runtime env has (requirements-runtime.txt: numpy<2, onnxruntime).
#
#   docker build -f platform/docker/triton-pool.Dockerfile -t registry.example/modelport-triton-pool:24.10 .
#   docker build -f platform/docker/triton-pool.Dockerfile --build-arg EXTRA="torch==2.5.1" ...   # TorchScript
ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:24.10-py3
FROM ${TRITON_IMAGE}
ARG EXTRA=""
# The same pins as the local runtime env, so a model's figure and behaviour match across runtimes.
RUN pip install --no-cache-dir "numpy==1.26.4" "onnxruntime==1.32.0" ${EXTRA} \
 && python3 -c "import numpy, onnxruntime; print('onnxruntime', onnxruntime.__version__)" \
 && test -x /opt/tritonserver/backends/python/triton_python_backend_stub
