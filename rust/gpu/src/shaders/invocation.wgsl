// An invocation's place in its workgroup, on a device whose subgroups the
// kernels do not use: its local index.

struct Invocation {
    @builtin(local_invocation_index) index: u32,
}

fn index_of(i: Invocation) -> u32 {
    return i.index;
}
