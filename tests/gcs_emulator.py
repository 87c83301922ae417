"""The local GCS bucket of the gs:// tests: `gcp-storage-emulator`, made to keep the two
promises of real GCS that tensorstore's OCDBT commits rely on.

1. A media download names the object's generation in `x-goog-generation`. tensorstore takes
   the generation of a ranged read from that header; without it a re-read manifest gets
   generation 0 and the next conditional commit fails with "Malformed StorageGeneration".
2. Reads and uploads honour `ifGenerationMatch` / `ifGenerationNotMatch` (412 / 304), so a
   commit against a stale manifest is refused as on GCS instead of silently overwriting it.

Run as `python tests/gcs_emulator.py PORT BUCKET`; it serves in memory until killed.
"""

import sys
import threading
from http import HTTPStatus

from gcp_storage_emulator import server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_COMMIT_LOCK = threading.Lock()  # a precondition check and its write happen as one step
_DOWNLOAD, _INSERT = objects.download, objects.insert


def _current_generation(storage, bucket_name, object_id) -> int:
    """The object's generation, 0 when it does not exist (GCS's meaning of `=0`)."""
    try:
        return int(storage.get_file_obj(bucket_name, object_id)["generation"])
    except NotFound:
        return 0


def _failed_precondition(request, generation: int):
    """The status GCS answers for this request's generation conditions, or None when they hold."""
    match = request.query.get("ifGenerationMatch")
    if match and int(match[0]) != generation:
        return HTTPStatus.PRECONDITION_FAILED
    not_match = request.query.get("ifGenerationNotMatch")
    if not_match and int(not_match[0]) == generation:
        return HTTPStatus.NOT_MODIFIED
    return None


def download(request, response, storage, *args, **kwargs):
    bucket_name, object_id = request.params["bucket_name"], request.params["object_id"]
    generation = _current_generation(storage, bucket_name, object_id)
    refused = _failed_precondition(request, generation) if generation else None
    if refused is not None:
        response.status = refused
        return
    _DOWNLOAD(request, response, storage, *args, **kwargs)
    if response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
        obj = storage.get_file_obj(bucket_name, object_id)
        response["x-goog-generation"] = str(obj["generation"])
        response["x-goog-metageneration"] = str(obj["metageneration"])


def insert(request, response, storage, *args, **kwargs):
    name = request.query.get("name")
    if not name:  # multipart and resumable uploads name the object in their body
        return _INSERT(request, response, storage, *args, **kwargs)
    with _COMMIT_LOCK:
        generation = _current_generation(
            storage, request.params["bucket_name"], name[0])
        refused = _failed_precondition(request, generation)
        if refused is not None:
            response.status = refused
            return
        _INSERT(request, response, storage, *args, **kwargs)


def serve(port: int, bucket: str) -> None:
    replacements = {_DOWNLOAD: download, _INSERT: insert}
    objects.download, objects.insert = download, insert  # `get ?alt=media` calls download
    for _, handlers in server.HANDLERS:
        for method, handler in handlers.items():
            handlers[method] = replacements.get(handler, handler)
    server.create_server("localhost", port, in_memory=True, default_bucket=bucket).run()


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2])
