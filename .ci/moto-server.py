"""moto's S3 server (`moto_server`, same arguments) with PutObject made atomic.

moto 5.2.5 checks `If-None-Match: *` and stores the object in two steps, and its server
handles requests on several threads, so two racing create-if-absent puts of one key could
both succeed. Real S3 (and MinIO, R2) decide such a race atomically, and fragvec's
concurrent-writer tests race exactly such puts (two commits of the same version), so this
launcher serialises PutObject (other requests still run concurrently).
"""

import sys
import threading

import moto
from moto.s3.responses import S3Response
from moto.server import main

assert moto.__version__ == "5.2.5", f"written for moto 5.2.5, found {moto.__version__}"

_put_lock = threading.Lock()
_put_object = S3Response.put_object


def put_object(self, *args, **kwargs):
    with _put_lock:
        return _put_object(self, *args, **kwargs)


S3Response.put_object = put_object

if __name__ == "__main__":
    main(sys.argv[1:])
