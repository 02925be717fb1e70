"""Scale-out on a Ray cluster, with Ray as an optional extra (pip install 'llamacy[ray]').

    llamacy serve --ray ADDRESS --replicas N -t T        ray_serve.py: the HTTP server as a Ray Serve app
    llamacy batch P -o OUT --ray ADDRESS --replicas N    ray_batch.py: the resumable batch on Ray Data

Modules, leaves first: cluster (importing Ray and connecting, with one-line errors), affinity (which
requests share a prompt prefix, and the Serve request router that keeps them on one replica), tunnel (an
HTTP request carried to a replica, and its ASGI messages back), job_board (the replicas' shared jobs),
ray_serve (the deployments and the foreground command), ray_batch. Nothing outside this package imports
Ray; nothing here runs unless --ray is given.
"""
