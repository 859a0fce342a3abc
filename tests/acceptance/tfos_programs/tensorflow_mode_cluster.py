"""A TensorFlowOnSpark 2.x style program (InputMode.TENSORFLOW) with a ps node and a chief.

Written exactly as for TFoS; the acceptance test changes only the import line below.
"""

from tensorflowonspark import TFCluster, TFNode


def main_fun(args, ctx):
    import json
    import os

    cluster_spec, server = TFNode.start_cluster_server(ctx)
    if ctx.job_name == "ps":
        server.join()
    out = TFNode.hdfs_path(ctx, args["model_dir"]).replace("file://", "")
    with open(os.path.join(out, f"{ctx.job_name}{ctx.task_index}.json"), "w") as f:
        json.dump({"jobs": sorted(cluster_spec.jobs), "num_workers": ctx.num_workers, "worker_num": ctx.worker_num}, f)


def main(sc, args):
    cluster = TFCluster.run(
        sc,
        main_fun,
        args,
        args["cluster_size"],
        1,
        False,
        TFCluster.InputMode.TENSORFLOW,
        driver_ps_nodes=True,
        master_node="chief",
    )
    cluster.shutdown()
