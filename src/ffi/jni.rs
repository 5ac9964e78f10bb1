//! JNI exports for the Java binding (`bindings/java`, class `io.kalos.Native`).
//!
//! Hidden from cbindgen (see `ffi/mod.rs`): these symbols are not part of the C API, but they live in
//! the same `libkalos.so`, so one library serves C, Python, Go and Java.
//!
//! Rules every export follows:
//! - The whole body runs inside [`EnvUnowned::with_env`], which wraps it in `catch_unwind`. An
//!   error becomes a Java exception: [`kalos::Error`](crate::Error) → the exception that
//!   `io.kalos.KalosException.of` picks (the subclass of the status's family), carrying the
//!   numeric status (the C ABI's value), a JNI argument problem →
//!   `IllegalArgumentException`, a zero (closed) handle → `IllegalStateException`, and a panic →
//!   `KalosException(PANIC)`. Nothing unwinds into the JVM, nothing aborts it.
//! - No JNI critical section and no pinned array is ever held across a wait for the server:
//!   Java arrays are copied into Rust buffers with `Get<Type>ArrayRegion` *before* the request is
//!   sent, and results are copied back with `Set<Type>ArrayRegion` after it completed. The GC is
//!   free to run while a thread waits on the server.
//! - The `*Direct` variant reads the query from, and writes the results into, direct NIO buffers
//!   through `GetDirectBufferAddress`: no copy in JNI at all (the only copies are the ones the
//!   shared-memory protocol itself makes, into and out of the request slot).
//! - The handle is a `Box<Kalos>` turned into a `jlong`. The Java side guarantees that `close`
//!   (which frees it) never runs concurrently with another call on the same handle (read/write
//!   lock in `io.kalos.Kalos`), and never passes a freed handle (it zeroes its copy first).
//! - Scratch buffers are thread-local and reused, so the steady-state recall path allocates
//!   nothing in Rust. (A Java virtual thread is pinned to its carrier for the whole native call,
//!   so a thread-local is never observed half-used.)
//!
//! [`EnvUnowned::with_env`]: ::jni::EnvUnowned::with_env

use std::cell::RefCell;
use std::ffi::c_void;

use jni::objects::{JByteArray, JClass, JFloatArray, JIntArray, JLongArray, JObject, JObjectArray, JString};
use jni::refs::Global;
use jni::sys::{jdouble, jfloat, jint, jlong, jobject, jobjectArray, jstring};
use jni::{jni_sig, jni_str, Env, EnvUnowned, JValue, Outcome};
use once_cell::sync::OnceCell;

use crate::client::{Kalos, ListOptions, Namespaces, Options, RecallOptions, UpsertOptions};
use crate::error::{Error, Status};
use crate::store::NEVER;
use crate::types::{Backend, Dtype, Metric, Recency, Role, SyncPolicy, MAX_K};

/// `io.kalos.KalosException`, registered by `Native.init` from the Java class's static
/// initialiser, so the lookup never depends on which class loader the calling thread has.
static EXCEPTION_CLASS: OnceCell<Global<JClass<'static>>> = OnceCell::new();

enum JErr {
    Kalos(Error),
    Jni(jni::errors::Error),
    IllegalArgument(String),
    IllegalState(String),
}

impl From<jni::errors::Error> for JErr {
    fn from(e: jni::errors::Error) -> JErr {
        JErr::Jni(e)
    }
}

impl From<Error> for JErr {
    fn from(e: Error) -> JErr {
        JErr::Kalos(e)
    }
}

type JResult<T> = std::result::Result<T, JErr>;

fn kerr<T>(status: Status, msg: impl Into<String>) -> JResult<T> {
    Err(JErr::Kalos(Error::new(status, msg)))
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        format!("Rust panic: {s}")
    } else if let Some(s) = p.downcast_ref::<String>() {
        format!("Rust panic: {s}")
    } else {
        "Rust panic (non-string payload)".to_string()
    }
}

/// Runs one export body: catches panics, turns errors into Java exceptions and returns
/// `T::default()` (0 / null) when an exception is pending.
fn run<'l, T: Default>(unowned: &mut EnvUnowned<'l>, f: impl FnOnce(&mut Env<'l>) -> JResult<T>) -> T {
    match unowned.with_env(f).into_outcome() {
        Outcome::Ok(t) => t,
        Outcome::Err(e) => {
            throw(unowned, e);
            T::default()
        }
        Outcome::Panic(p) => {
            throw(unowned, JErr::Kalos(Error::new(Status::Panic, panic_message(&*p))));
            T::default()
        }
    }
}

fn throw(unowned: &mut EnvUnowned<'_>, e: JErr) {
    // Any failure (or panic) while throwing is swallowed: the worst case is a Java call that
    // returns a default value, never an abort.
    let _ = unowned
        .with_env(|env| -> jni::errors::Result<()> {
            if env.exception_check() {
                // A Java exception is already pending (e.g. ArrayIndexOutOfBounds from an array
                // region call): let it propagate as is.
                return Ok(());
            }
            match e {
                JErr::Kalos(err) => throw_kalos(env, err.status as i32, &err.message),
                JErr::Jni(jni::errors::Error::JavaException) => Ok(()),
                JErr::Jni(other) => {
                    env.throw_new(jni_str!("java/lang/IllegalArgumentException"), jni::strings::JNIString::from(format!("JNI: {other}")))
                }
                JErr::IllegalArgument(m) => env.throw_new(jni_str!("java/lang/IllegalArgumentException"), jni::strings::JNIString::from(m)),
                JErr::IllegalState(m) => env.throw_new(jni_str!("java/lang/IllegalStateException"), jni::strings::JNIString::from(m)),
            }
        })
        .into_outcome();
}

/// Throws the exception `KalosException.of(status, message)` picks: the subclass of the status's
/// family (`NotFoundException`, `KalosTimeoutException`, ...) or `KalosException` itself.
fn throw_kalos(env: &mut Env<'_>, status: i32, message: &str) -> jni::errors::Result<()> {
    let msg = env.new_string(message)?;
    let sig = jni_sig!("(ILjava/lang/String;)Lio/kalos/KalosException;");
    let args = [JValue::Int(status), JValue::Object(&msg)];
    let obj = match EXCEPTION_CLASS.get() {
        Some(cls) => env.call_static_method(cls, jni_str!("of"), sig, &args)?,
        None => env.call_static_method(jni_str!("io/kalos/KalosException"), jni_str!("of"), sig, &args)?,
    }
    .l()?;
    let t = env.cast_local::<jni::objects::JThrowable>(obj)?;
    env.throw(t)
}

fn handle<'a>(h: jlong) -> JResult<&'a Kalos> {
    if h == 0 {
        return Err(JErr::IllegalState("the Kalos handle is closed".into()));
    }
    // SAFETY: a non-zero handle is a live `Box<Kalos>` from `open`; the Java side never frees it
    // while a call is in flight (see the module docs).
    Ok(unsafe { &*(h as *const Kalos) })
}

thread_local! {
    static QBUF: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static IDBUF: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    static SCBUF: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

fn as_i64(v: &[u64]) -> &[i64] {
    // SAFETY: same size and alignment; every bit pattern is valid.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const i64, v.len()) }
}

fn as_i8(v: &[u8]) -> &[i8] {
    // SAFETY: same size and alignment; every bit pattern is valid.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const i8, v.len()) }
}

fn long_vec(env: &Env, a: &JLongArray) -> JResult<Vec<u64>> {
    let n = a.len(env)?;
    let mut v = vec![0i64; n];
    a.get_region(env, 0, &mut v)?;
    Ok(v.into_iter().map(|x| x as u64).collect())
}

fn opt_long_vec(env: &Env, a: &JLongArray) -> JResult<Option<Vec<u64>>> {
    if a.is_null() {
        Ok(None)
    } else {
        long_vec(env, a).map(Some)
    }
}

fn float_vec(env: &Env, a: &JFloatArray) -> JResult<Vec<f32>> {
    let n = a.len(env)?;
    let mut v = vec![0f32; n];
    a.get_region(env, 0, &mut v)?;
    Ok(v)
}

fn opt_byte_vec(env: &Env, a: &JByteArray) -> JResult<Option<Vec<u8>>> {
    if a.is_null() {
        return Ok(None);
    }
    let mut v = vec![0i8; a.len(env)?];
    a.get_region(env, 0, &mut v)?;
    Ok(Some(v.into_iter().map(|b| b as u8).collect()))
}

/// The recall options of one call: the fields of `io.kalos.RecallOptions`, which every recall
/// export takes in this order (`consistency` holds `KALOS_RECALL_*` flags, `min_seqs` a write
/// token or null).
#[allow(clippy::too_many_arguments)] // one argument per field of the Java options
fn recall_opts(
    env: &Env,
    ns: &JLongArray,
    filter: &JByteArray,
    weight: jfloat,
    half_life_ms: jdouble,
    timeout_ms: jlong,
    consistency: jint,
    min_seqs: &JLongArray,
) -> JResult<RecallOptions> {
    let mut o = RecallOptions {
        namespaces: opt_long_vec(env, ns)?,
        recency: if weight != 0.0 { Some(Recency { weight, half_life_ms }) } else { None },
        filter: opt_byte_vec(env, filter)?,
        timeout_ms: timeout_opt(timeout_ms)?,
        min_seqs: opt_long_vec(env, min_seqs)?,
        ..RecallOptions::default()
    };
    super::api::set_consistency(&mut o, consistency as u32)?;
    Ok(o)
}

/// Writes a stale-read recall's lag into `out` (`[entries, ms]`; zeros when the reply carried
/// none) when `out` is not null.
fn put_lag(env: &Env, out: &JLongArray, lag: Option<crate::client::Lag>) -> JResult<()> {
    if !out.is_null() {
        let l = lag.unwrap_or_default();
        out.set_region(env, 0, &[l.entries as i64, l.ms as i64])?;
    }
    Ok(())
}

fn timeout_opt(t: jlong) -> JResult<Option<u64>> {
    match t {
        0 => Ok(None),
        t if t > 0 => Ok(Some(t as u64)),
        t => kerr(Status::InvalidArgument, format!("timeout {t} ms must be >= 0")),
    }
}

fn k_of(k: jint) -> JResult<usize> {
    if k <= 0 || k as usize > MAX_K {
        return kerr(Status::KOutOfRange, format!("k = {k}; k must be between 1 and {MAX_K}"));
    }
    Ok(k as usize)
}

fn null_check(o: &JObject, what: &str) -> JResult<()> {
    if o.is_null() {
        return kerr(Status::NullPointer, format!("{what} is null"));
    }
    Ok(())
}

/// Address and capacity (in elements) of a direct NIO buffer.
fn direct(env: &Env, buf: &JObject, what: &str) -> JResult<(*mut c_void, usize)> {
    null_check(buf, what)?;
    let raw = env.get_raw();
    // SAFETY: `raw` is the current thread's valid JNIEnv; both functions are JNI 1.4, which
    // jni-rs requires; `buf` is a live local reference.
    let (addr, cap) = unsafe {
        let iface = *raw;
        (((*iface).v1_4.GetDirectBufferAddress)(raw, buf.as_raw()), ((*iface).v1_4.GetDirectBufferCapacity)(raw, buf.as_raw()))
    };
    if addr.is_null() || cap < 0 {
        return Err(JErr::IllegalArgument(format!("{what} is not a direct buffer (use ByteBuffer.allocateDirect)")));
    }
    Ok((addr, cap as usize))
}

fn check_region(what: &str, addr: *mut c_void, cap: usize, pos: jint, len: usize, align: usize) -> JResult<*mut c_void> {
    if pos < 0 || pos as usize > cap || cap - (pos as usize) < len {
        return Err(JErr::IllegalArgument(format!("{what}: {len} elements at position {pos} exceed its capacity {cap}")));
    }
    let elem = align; // element size equals alignment for f32 / u64
                      // SAFETY: in bounds of the buffer (checked just above).
    let p = unsafe { (addr as *mut u8).add(pos as usize * elem) } as *mut c_void;
    if !(p as usize).is_multiple_of(align) {
        return Err(JErr::IllegalArgument(format!(
            "{what} is not {align}-byte aligned (a sliced or offset ByteBuffer); use an aligned direct buffer"
        )));
    }
    Ok(p)
}

// ------------------------------------------------------------------------------------------
// Exports. Names follow the JNI mangling of `io.kalos.Native.<method>`.
// ------------------------------------------------------------------------------------------

/// `static native void init(Class<?> exceptionClass)`
#[no_mangle]
pub extern "system" fn Java_io_kalos_Native_init<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>, cls: JClass<'l>) {
    run(&mut env, |env| {
        if !cls.is_null() && EXCEPTION_CLASS.get().is_none() {
            let g = env.new_global_ref(cls)?;
            let _ = EXCEPTION_CLASS.set(g);
        }
        Ok(())
    })
}

/// `static native String version()`
#[no_mangle]
pub extern "system" fn Java_io_kalos_Native_version<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>) -> jstring {
    run(&mut env, |env| Ok(env.new_string(crate::VERSION)?.into_raw()))
}

/// `static native String statusName(int status)`
#[no_mangle]
pub extern "system" fn Java_io_kalos_Native_statusName<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>, s: jint) -> jstring {
    run(&mut env, |env| {
        let name = if s >= 0 && (s as usize) < Status::ALL.len() { Status::ALL[s as usize].name() } else { "UNKNOWN" };
        Ok(env.new_string(name)?.into_raw())
    })
}

/// `static native String opName(int op)`: the op code's name (`kalos_op_name`).
#[no_mangle]
pub extern "system" fn Java_io_kalos_Native_opName<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>, op: jint) -> jstring {
    run(&mut env, |env| Ok(env.new_string(crate::wire::op_name(op as u32))?.into_raw()))
}

/// Test hook: unwinds inside an export, to prove a panic becomes `KalosException(PANIC)`.
/// `resume_unwind` starts the same unwinding as `panic!` but skips the panic hook, so the passing
/// test prints no "thread panicked" report on stderr.
#[no_mangle]
pub extern "system" fn Java_io_kalos_Native_debugPanic<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>) -> jint {
    run(&mut env, |_env| -> JResult<jint> { std::panic::resume_unwind(Box::new("debugPanic called (test hook)")) })
}

/// Number of option slots `open` expects (must match `KalosOptions.toNative`).
const OPT_LEN: usize = 24;

fn u32_opt(v: i64, what: &str) -> JResult<u32> {
    u32::try_from(v).or_else(|_| kerr(Status::InvalidArgument, format!("option {what} = {v} is out of range")))
}

fn u64_opt(v: i64, what: &str) -> JResult<u64> {
    u64::try_from(v).or_else(|_| kerr(Status::InvalidArgument, format!("option {what} = {v} must be >= 0")))
}

/// `static native long open(String name, long[] options, String dataDir)`
#[no_mangle]
pub extern "system" fn Java_io_kalos_Native_open<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    name: JString<'l>,
    opts: JLongArray<'l>,
    data_dir: JString<'l>,
) -> jlong {
    run(&mut env, |env| {
        null_check(&name, "name")?;
        null_check(&opts, "options")?;
        let name = name.try_to_string(env)?;
        let mut o = [0i64; OPT_LEN];
        if opts.len(env)? != OPT_LEN {
            return Err(JErr::IllegalArgument(format!("options array must have {OPT_LEN} entries")));
        }
        opts.get_region(env, 0, &mut o)?;
        let options = Options {
            role: Role::from_u32(u32_opt(o[0], "role")?)?,
            dim: u32_opt(o[1], "dim")?,
            metric: Metric::from_u32(u32_opt(o[2], "metric")?)?,
            dtype: Dtype::from_u32(u32_opt(o[3], "dtype")?)?,
            backend: Backend::from_u32(u32_opt(o[4], "backend")?)?,
            capacity: u64_opt(o[5], "capacity")?,
            slots: u32_opt(o[6], "slots")?,
            slot_bytes: u32_opt(o[7], "slotBytes")?,
            mode: u32_opt(o[8], "mode")?,
            max_payload_bytes: u32_opt(o[9], "maxPayloadBytes")?,
            client_spin_ns: u64_opt(o[10], "clientSpinNs")?,
            server_spin_ns: u64_opt(o[11], "serverSpinNs")?,
            timeout_ms: u64_opt(o[12], "timeoutMs")?,
            heartbeat_timeout_ms: u64_opt(o[13], "heartbeatTimeoutMs")?,
            sync: SyncPolicy::from_u32(u32_opt(o[14], "sync")?)?,
            sync_interval_ms: u64_opt(o[15], "syncIntervalMs")?,
            threads: u32_opt(o[16], "threads")?,
            gpu_memory_bytes: u64_opt(o[17], "gpuMemoryBytes")?,
            ephemeral: o[18] != 0,
            scan: crate::types::Scan::from_u32(u32_opt(o[19], "scan")?)?,
            rerank: u32_opt(o[20], "rerank")?,
            device_shards: u32_opt(o[21], "deviceShards")?,
            placement: crate::types::Placement::from_u32(u32_opt(o[22], "placement")?)?,
            gpus: o[23] as u64,
            data_dir: if data_dir.is_null() { None } else { Some(data_dir.try_to_string(env)?.into()) },
        };
        let k = Kalos::open(&name, &options)?;
        Ok(Box::into_raw(Box::new(k)) as jlong)
    })
}

/// `static native void close(long handle)`: frees the handle (stops the server thread if this
/// handle runs it). The Java side calls it once, with no other call in flight.
#[no_mangle]
pub extern "system" fn Java_io_kalos_Native_close<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>, h: jlong) {
    run(&mut env, |_env| {
        if h != 0 {
            // SAFETY: see `handle`; the Java side guarantees exclusivity and a single close.
            let k = unsafe { Box::from_raw(h as *mut Kalos) };
            k.close();
            drop(k);
        }
        Ok(())
    })
}

/// `static native int dim(long handle)`
#[no_mangle]
pub extern "system" fn Java_io_kalos_Native_dim<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>, h: jlong) -> jint {
    run(&mut env, |_env| Ok(handle(h)?.dim() as jint))
}

/// `static native int maxPayloadBytes(long handle)`
#[no_mangle]
pub extern "system" fn Java_io_kalos_Native_maxPayloadBytes<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>, h: jlong) -> jint {
    run(&mut env, |_env| Ok(handle(h)?.max_payload_bytes().min(i32::MAX as usize) as jint))
}

/// `static native boolean isServer(long handle)`
#[no_mangle]
pub extern "system" fn Java_io_kalos_Native_isServer<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>, h: jlong) -> jni::sys::jboolean {
    run(&mut env, |_env| Ok(handle(h)?.is_server()))
}

/// `static native int recall(long h, float[] query, int k, long[] ns, byte[] filter, float w, double halfLife,
/// long timeoutMs, int consistency, long[] minSeqs, long[] ids, float[] scores, long[] lag)`:
/// copies the query once (GetFloatArrayRegion into a reused thread-local buffer), then waits
/// for the server with nothing pinned. `lag`, when not null, gets `[entries, ms]`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "system" fn Java_io_kalos_Native_recall<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    query: JFloatArray<'l>,
    k: jint,
    ns: JLongArray<'l>,
    filter: JByteArray<'l>,
    weight: jfloat,
    half_life_ms: jdouble,
    timeout_ms: jlong,
    consistency: jint,
    min_seqs: JLongArray<'l>,
    ids_out: JLongArray<'l>,
    scores_out: JFloatArray<'l>,
    lag_out: JLongArray<'l>,
) -> jint {
    run(&mut env, |env| {
        let kal = handle(h)?;
        null_check(&query, "query")?;
        null_check(&ids_out, "ids")?;
        null_check(&scores_out, "scores")?;
        let k = k_of(k)?;
        let opts = recall_opts(env, &ns, &filter, weight, half_life_ms, timeout_ms, consistency, &min_seqs)?;
        let n = QBUF.with(|qb| -> JResult<usize> {
            let mut q = qb.borrow_mut();
            let len = query.len(env)?;
            q.resize(len, 0.0);
            query.get_region(env, 0, &mut q)?;
            IDBUF.with(|ib| {
                SCBUF.with(|sb| {
                    let (mut ids, mut sc) = (ib.borrow_mut(), sb.borrow_mut());
                    ids.resize(k, 0);
                    sc.resize(k, 0.0);
                    let (n, lag) = kal.recall_lag(&q, k, &opts, &mut ids[..k], &mut sc[..k])?;
                    ids_out.set_region(env, 0, as_i64(&ids[..n]))?;
                    scores_out.set_region(env, 0, &sc[..n])?;
                    put_lag(env, &lag_out, lag)?;
                    Ok(n)
                })
            })
        })?;
        Ok(n as jint)
    })
}

/// `static native int recallDirect(long h, Buffer query, int qPos, int k, long[] ns, byte[] filter, float w,
/// double halfLife, long timeoutMs, int consistency, long[] minSeqs, Buffer ids, int idsPos,
/// Buffer scores, int scoresPos, long[] lag)`: zero-copy path over direct, native-order
/// `FloatBuffer`/`LongBuffer`s.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "system" fn Java_io_kalos_Native_recallDirect<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    query: JObject<'l>,
    q_pos: jint,
    k: jint,
    ns: JLongArray<'l>,
    filter: JByteArray<'l>,
    weight: jfloat,
    half_life_ms: jdouble,
    timeout_ms: jlong,
    consistency: jint,
    min_seqs: JLongArray<'l>,
    ids_out: JObject<'l>,
    ids_pos: jint,
    scores_out: JObject<'l>,
    scores_pos: jint,
    lag_out: JLongArray<'l>,
) -> jint {
    run(&mut env, |env| {
        let kal = handle(h)?;
        let k = k_of(k)?;
        let dim = kal.dim();
        let (qa, qc) = direct(env, &query, "query")?;
        let (ia, ic) = direct(env, &ids_out, "ids")?;
        let (sa, sc) = direct(env, &scores_out, "scores")?;
        let q = check_region("query", qa, qc, q_pos, dim, 4)?;
        let ip = check_region("ids", ia, ic, ids_pos, k, 8)?;
        let sp = check_region("scores", sa, sc, scores_pos, k, 4)?;
        let overlap =
            |a: *mut c_void, an: usize, b: *mut c_void, bn: usize| (a as usize) < (b as usize) + bn && (b as usize) < (a as usize) + an;
        if overlap(q, dim * 4, ip, k * 8) || overlap(q, dim * 4, sp, k * 4) || overlap(ip, k * 8, sp, k * 4) {
            return Err(JErr::IllegalArgument("query, ids and scores buffers must not overlap".into()));
        }
        let opts = recall_opts(env, &ns, &filter, weight, half_life_ms, timeout_ms, consistency, &min_seqs)?;
        // SAFETY: regions checked in bounds, aligned and pairwise disjoint above; the buffers stay reachable for
        // the whole call (they are arguments of this native frame). Java code racing on the same
        // buffer memory is the caller's data race, as with any NIO buffer, not memory unsafety in
        // Rust terms beyond torn values.
        let (q, ids, scores) = unsafe {
            (
                std::slice::from_raw_parts(q as *const f32, dim),
                std::slice::from_raw_parts_mut(ip as *mut u64, k),
                std::slice::from_raw_parts_mut(sp as *mut f32, k),
            )
        };
        let (n, lag) = kal.recall_lag(q, k, &opts, ids, scores)?;
        put_lag(env, &lag_out, lag)?;
        Ok(n as jint)
    })
}

/// `static native byte[] recallPayloads(long h, float[] query, int k, long[] ns, byte[] filter, float w,
/// double halfLife, long timeoutMs, int consistency, long[] minSeqs, long[] ids, float[] scores,
/// int[] countAndLens)`:
/// `countAndLens[0]` = hit count, `countAndLens[1 + i]` = payload length of hit i (-1 = none);
/// returns every payload packed back to back.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "system" fn Java_io_kalos_Native_recallPayloads<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    query: JFloatArray<'l>,
    k: jint,
    ns: JLongArray<'l>,
    filter: JByteArray<'l>,
    weight: jfloat,
    half_life_ms: jdouble,
    timeout_ms: jlong,
    consistency: jint,
    min_seqs: JLongArray<'l>,
    ids_out: JLongArray<'l>,
    scores_out: JFloatArray<'l>,
    lens_out: JIntArray<'l>,
) -> jobject {
    run(&mut env, |env| {
        let kal = handle(h)?;
        null_check(&query, "query")?;
        let k = k_of(k)?;
        let opts = recall_opts(env, &ns, &filter, weight, half_life_ms, timeout_ms, consistency, &min_seqs)?;
        let q = float_vec(env, &query)?;
        let hits = kal.recall_with_payloads(&q, k, &opts)?;
        let n = hits.len();
        let ids: Vec<i64> = hits.iter().map(|h| h.id as i64).collect();
        let scores: Vec<f32> = hits.iter().map(|h| h.score).collect();
        let mut lens = Vec::with_capacity(n + 1);
        lens.push(n as i32);
        let mut packed = Vec::new();
        for hit in &hits {
            match &hit.payload {
                None => lens.push(-1),
                Some(p) => {
                    lens.push(p.len() as i32);
                    packed.extend_from_slice(p);
                }
            }
        }
        ids_out.set_region(env, 0, &ids)?;
        scores_out.set_region(env, 0, &scores)?;
        lens_out.set_region(env, 0, &lens)?;
        Ok(env.byte_array_from_slice(&packed)?.into_raw())
    })
}

/// `static native void recallBatch(long h, float[] queries, int nq, int k, long[] ns, byte[] filter, float w,
/// double halfLife, long timeoutMs, int consistency, long[] minSeqs, long[] ids, float[] scores,
/// int[] counts)`
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "system" fn Java_io_kalos_Native_recallBatch<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    queries: JFloatArray<'l>,
    nq: jint,
    k: jint,
    ns: JLongArray<'l>,
    filter: JByteArray<'l>,
    weight: jfloat,
    half_life_ms: jdouble,
    timeout_ms: jlong,
    consistency: jint,
    min_seqs: JLongArray<'l>,
    ids_out: JLongArray<'l>,
    scores_out: JFloatArray<'l>,
    counts_out: JIntArray<'l>,
) {
    run(&mut env, |env| {
        let kal = handle(h)?;
        null_check(&queries, "queries")?;
        let k = k_of(k)?;
        if nq <= 0 {
            return kerr(Status::InvalidArgument, "a batch needs at least one query");
        }
        let nq = nq as usize;
        let opts = recall_opts(env, &ns, &filter, weight, half_life_ms, timeout_ms, consistency, &min_seqs)?;
        let q = float_vec(env, &queries)?;
        let mut ids = vec![0u64; nq * k];
        let mut scores = vec![0f32; nq * k];
        let mut counts = vec![0usize; nq];
        kal.recall_batch_into(&q, nq, k, &opts, &mut ids, &mut scores, &mut counts)?;
        let counts: Vec<i32> = counts.iter().map(|&c| c as i32).collect();
        ids_out.set_region(env, 0, as_i64(&ids))?;
        scores_out.set_region(env, 0, &scores)?;
        counts_out.set_region(env, 0, &counts)?;
        Ok(())
    })
}

/// `static native void upsert(long h, long[] ids, float[] vectors, long namespace,
/// long[] namespaces, byte[] payloads, int[] payloadLens, long ttlMs, long expiresAtMs,
/// long timeoutMs, byte[] fields)`. `payloadLens[i]` = -1 means no payload; `expiresAtMs`
/// 0 = never; `fields` a fields block (docs/FORMATS.md) or null.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "system" fn Java_io_kalos_Native_upsert<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    ids: JLongArray<'l>,
    vectors: JFloatArray<'l>,
    namespace: jlong,
    namespaces: JLongArray<'l>,
    payloads: JByteArray<'l>,
    payload_lens: JIntArray<'l>,
    ttl_ms: jlong,
    expires_at_ms: jlong,
    timeout_ms: jlong,
    fields: JByteArray<'l>,
) {
    run(&mut env, |env| {
        let kal = handle(h)?;
        null_check(&ids, "ids")?;
        null_check(&vectors, "vectors")?;
        let ids = long_vec(env, &ids)?;
        let vecs = float_vec(env, &vectors)?;
        let per_ns = opt_long_vec(env, &namespaces)?;
        if ttl_ms < 0 || expires_at_ms < 0 {
            return kerr(Status::InvalidArgument, "ttlMs and expiresAtMs must be >= 0");
        }
        let packed: Vec<u8> = if payloads.is_null() {
            Vec::new()
        } else {
            let n = payloads.len(env)?;
            let mut v = vec![0i8; n];
            payloads.get_region(env, 0, &mut v)?;
            v.into_iter().map(|b| b as u8).collect()
        };
        let lens: Option<Vec<i32>> = if payload_lens.is_null() {
            None
        } else {
            let n = payload_lens.len(env)?;
            let mut v = vec![0i32; n];
            payload_lens.get_region(env, 0, &mut v)?;
            Some(v)
        };
        let payload_refs: Option<Vec<Option<&[u8]>>> = match &lens {
            None => None,
            Some(lens) => {
                let mut off = 0usize;
                let mut out = Vec::with_capacity(lens.len());
                for &l in lens {
                    if l < 0 {
                        out.push(None);
                    } else {
                        let end = off + l as usize;
                        if end > packed.len() {
                            return kerr(Status::InvalidArgument, "payload lengths exceed the packed payload bytes");
                        }
                        out.push(Some(&packed[off..end]));
                        off = end;
                    }
                }
                Some(out)
            }
        };
        let fields = match opt_byte_vec(env, &fields)? {
            Some(b) => Some(crate::meta::decode_fields_block(&b, ids.len())?),
            None => None,
        };
        let opts = UpsertOptions {
            fields: fields.as_deref(),
            namespaces: match &per_ns {
                Some(v) => Namespaces::PerItem(v),
                None => Namespaces::One(namespace as u64),
            },
            payloads: payload_refs,
            ttl_ms: ttl_ms as u64,
            expires_ms: if expires_at_ms == 0 { NEVER } else { expires_at_ms as u64 },
            timeout_ms: timeout_opt(timeout_ms)?,
        };
        kal.upsert(&ids, &vecs, &opts)?;
        Ok(())
    })
}

/// `static native long delete(long h, long[] ids, long timeoutMs)`
#[no_mangle]
pub extern "system" fn Java_io_kalos_Native_delete<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    ids: JLongArray<'l>,
    timeout_ms: jlong,
) -> jlong {
    run(&mut env, |env| {
        let kal = handle(h)?;
        null_check(&ids, "ids")?;
        let ids = long_vec(env, &ids)?;
        Ok(kal.delete_timeout(&ids, timeout_opt(timeout_ms)?)? as jlong)
    })
}

/// `static native long deleteWhere(long h, long[] ns, byte[] filter)`: deletes the memories
/// that match the filter expression (and lie in one of `ns`, when not null).
#[no_mangle]
pub extern "system" fn Java_io_kalos_Native_deleteWhere<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    ns: JLongArray<'l>,
    filter: JByteArray<'l>,
) -> jlong {
    run(&mut env, |env| {
        let kal = handle(h)?;
        null_check(&filter, "filter")?;
        let ns = opt_long_vec(env, &ns)?;
        let filter = opt_byte_vec(env, &filter)?.unwrap_or_default();
        Ok(kal.delete_where(ns.as_deref(), &filter)? as jlong)
    })
}

/// `static native long[] list(long h, long[] ns, byte[] filter, boolean hasAfter, long after,
/// int limit, long timeoutMs, long[] remaining)`: one page of ids, ascending (`Kalos::list`);
/// `remaining[0]` gets how many more match after the page's last id.
#[no_mangle]
#[allow(clippy::too_many_arguments)] // one argument per field of the Java call
pub extern "system" fn Java_io_kalos_Native_list<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    ns: JLongArray<'l>,
    filter: JByteArray<'l>,
    has_after: jni::sys::jboolean,
    after: jlong,
    limit: jint,
    timeout_ms: jlong,
    remaining: JLongArray<'l>,
) -> jobject {
    run(&mut env, |env| {
        let kal = handle(h)?;
        null_check(&remaining, "remaining")?;
        if limit < 0 {
            return kerr(Status::InvalidArgument, format!("limit {limit} must be >= 0"));
        }
        let opts = ListOptions {
            namespaces: opt_long_vec(env, &ns)?,
            filter: opt_byte_vec(env, &filter)?,
            after: has_after.then_some(after as u64),
            timeout_ms: timeout_opt(timeout_ms)?,
        };
        let (ids, rest) = kal.list(&opts, limit as usize)?;
        remaining.set_region(env, 0, &[rest as i64])?;
        let arr = env.new_long_array(ids.len())?;
        arr.set_region(env, 0, as_i64(&ids))?;
        Ok(arr.into_raw())
    })
}

/// `static native byte[] getFields(long h, long[] ids, int[] lens)`: returns every memory's
/// fields (`count u16 | (name, value)*`, docs/FORMATS.md) packed back to back, with one
/// length per id in `lens`.
#[no_mangle]
pub extern "system" fn Java_io_kalos_Native_getFields<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    ids: JLongArray<'l>,
    lens: JIntArray<'l>,
) -> jobject {
    run(&mut env, |env| {
        let kal = handle(h)?;
        null_check(&ids, "ids")?;
        null_check(&lens, "lens")?;
        let ids = long_vec(env, &ids)?;
        let mut packed = Vec::new();
        let mut l = Vec::with_capacity(ids.len());
        for r in kal.get(&ids)? {
            let start = packed.len();
            crate::meta::encode_item(&mut packed, &r.fields);
            l.push((packed.len() - start) as i32);
        }
        lens.set_region(env, 0, &l)?;
        let arr = env.new_byte_array(packed.len())?;
        arr.set_region(env, 0, as_i8(&packed))?;
        Ok(arr.into_raw())
    })
}

/// `static native long deleteNamespace(long h, long namespace)`
#[no_mangle]
pub extern "system" fn Java_io_kalos_Native_deleteNamespace<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>, h: jlong, ns: jlong) -> jlong {
    run(&mut env, |_env| Ok(handle(h)?.delete_namespace(ns as u64)? as jlong))
}

/// `static native long[] writeSeqs(long h)`: the handle's write token (`Kalos::write_seqs`).
#[no_mangle]
pub extern "system" fn Java_io_kalos_Native_writeSeqs<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>, h: jlong) -> jobject {
    run(&mut env, |env| {
        let seqs = handle(h)?.write_seqs();
        let arr = env.new_long_array(seqs.len())?;
        arr.set_region(env, 0, as_i64(&seqs))?;
        Ok(arr.into_raw())
    })
}

/// `static native long clear(long h)`
#[no_mangle]
pub extern "system" fn Java_io_kalos_Native_clear<'l>(mut env: EnvUnowned<'l>, _c: JClass<'l>, h: jlong) -> jlong {
    run(&mut env, |_env| Ok(handle(h)?.clear()? as jlong))
}

/// `static native byte[] get(long h, long[] ids, float[] vectors, long[] meta, int[] lens)`:
/// `vectors` gets n × dim floats, `meta` 3 × n longs (namespace, createdMs, expiresMs with
/// -1 = never), `lens` n payload lengths (-1 = none); returns the payloads packed.
#[no_mangle]
pub extern "system" fn Java_io_kalos_Native_get<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    ids: JLongArray<'l>,
    vectors: JFloatArray<'l>,
    meta: JLongArray<'l>,
    lens: JIntArray<'l>,
) -> jobject {
    run(&mut env, |env| {
        let kal = handle(h)?;
        null_check(&ids, "ids")?;
        let ids = long_vec(env, &ids)?;
        let recs = kal.get(&ids)?;
        let dim = kal.dim();
        let mut v = Vec::with_capacity(recs.len() * dim);
        let mut m = Vec::with_capacity(recs.len() * 3);
        let mut l = Vec::with_capacity(recs.len());
        let mut packed = Vec::new();
        for r in &recs {
            v.extend_from_slice(&r.vector);
            m.extend_from_slice(&[r.namespace as i64, r.created_ms as i64, if r.expires_ms == NEVER { -1 } else { r.expires_ms as i64 }]);
            match &r.payload {
                None => l.push(-1),
                Some(p) => {
                    l.push(p.len() as i32);
                    packed.extend_from_slice(p);
                }
            }
        }
        vectors.set_region(env, 0, &v)?;
        meta.set_region(env, 0, &m)?;
        lens.set_region(env, 0, &l)?;
        let arr = env.new_byte_array(packed.len())?;
        arr.set_region(env, 0, as_i8(&packed))?;
        Ok(arr.into_raw())
    })
}

/// `static native String[] stats(long h, long[] out, long[][] ops)`: fills 20 counters (order
/// of `io.kalos.Stats`), sets `ops[0]` to the request counters by op and status as
/// {op, status, count} triples, and returns {engine name, fallback reason}.
#[no_mangle]
pub extern "system" fn Java_io_kalos_Native_stats<'l>(
    mut env: EnvUnowned<'l>,
    _c: JClass<'l>,
    h: jlong,
    out: JLongArray<'l>,
    ops: JObjectArray<'l>,
) -> jobjectArray {
    run(&mut env, |env| {
        let s = handle(h)?.stats()?;
        let v = [
            s.count,
            s.capacity,
            s.dim,
            s.metric,
            s.dtype,
            s.engine,
            s.requests,
            s.queries,
            s.batches,
            s.errors,
            s.p50_ns,
            s.p99_ns,
            s.queue_depth,
            s.server_pid,
            s.epoch,
            s.payload_bytes,
            s.uptime_ms,
            s.engine_fallbacks,
            s.rerank_queries,
            s.rerank_uncertain,
        ];
        out.set_region(env, 0, as_i64(&v))?;
        let triples: Vec<u64> = s.requests_by.iter().flat_map(|c| [c.op as u64, c.status as u64, c.count]).collect();
        let arr = env.new_long_array(triples.len())?;
        arr.set_region(env, 0, as_i64(&triples))?;
        ops.set_element(env, 0, arr)?;
        let names = env.new_object_array(2, jni_str!("java/lang/String"), JObject::null())?;
        for (i, text) in [&s.engine_name, &s.fallback_reason].into_iter().enumerate() {
            let js = env.new_string(text)?;
            names.set_element(env, i, js)?;
        }
        Ok(names.into_raw())
    })
}
