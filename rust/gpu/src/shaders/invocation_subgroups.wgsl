// An invocation's place in its workgroup, on a device whose subgroups the
// kernels use: counted by subgroups, so that places within one subgroup
// are neighbours however the driver numbers local indices (a kernel that
// pairs invocations THREADS / 2, ..., 2, 1 apart pairs subgroup lanes).

struct Invocation {
    @builtin(subgroup_id) subgroup: u32,
    @builtin(subgroup_size) size: u32,
    @builtin(subgroup_invocation_id) lane: u32,
}

fn index_of(i: Invocation) -> u32 {
    return i.subgroup * i.size + i.lane;
}
