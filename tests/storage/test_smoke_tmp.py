import time
from fleetserve.storage.s3 import S3Store
import nats
from fleetserve.storage.nats import NatsObjectStore

async def test_s3(s3_server):
    s = S3Store(s3_server.bucket, prefix="p1", endpoint=s3_server.endpoint, access_key_id="a", secret_access_key="b")
    t=time.time()
    await s.put("req/a-in", b"hello")
    assert await s.get("req/a-in") == b"hello"
    await s.put("req/big", bytes(3<<20))
    assert len(await s.get("req/big")) == 3<<20
    await s.delete("req/a-in"); await s.delete("req/a-in")
    print(await s.sweep(0.0))
    print(time.time()-t)
    await s.close()

async def test_nats(nats_server):
    nc = await nats.connect(nats_server.url)
    t=time.time()
    s = await NatsObjectStore.open(nc, "b1", storage="memory", ttl=60)
    await s.put("req/a-in", b"hello")
    assert await s.get("req/a-in") == b"hello"
    await s.put("req/big", bytes(3<<20))
    assert len(await s.get("req/big")) == 3<<20
    await s.delete("req/a-in"); await s.delete("req/a-in")
    print(await s.sweep(0.0))
    print(time.time()-t)
    await nc.close()
