"""Operations helpers: figures the deployment (Helm values, KEDA) derives from the product.

``fleetserve.ops.capacity``: a worker pool's KEDA lag thresholds from tuned profiles.
"""
