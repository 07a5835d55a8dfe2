"""Traffic for soak: the same request set replayed every round, bounded and never crashing."""

from vramdoctor.soak.traffic.client import LoadClient, Outcome
from vramdoctor.soak.traffic.driver import Budget, RoundResult, run_round
from vramdoctor.soak.traffic.features import FEATURES, Feature, Shape, ShapePlan, parse_features
from vramdoctor.soak.traffic.images import (
    ImageSize,
    data_url,
    generate_images,
    load_image_dir,
    parse_image_size,
)
from vramdoctor.soak.traffic.workload import PlannedRequest, build_requests

__all__ = [
    "FEATURES",
    "Budget",
    "Feature",
    "ImageSize",
    "LoadClient",
    "Outcome",
    "PlannedRequest",
    "RoundResult",
    "Shape",
    "ShapePlan",
    "build_requests",
    "data_url",
    "generate_images",
    "load_image_dir",
    "parse_features",
    "parse_image_size",
    "run_round",
]
