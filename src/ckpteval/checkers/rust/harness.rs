#[allow(dead_code, unused)]
mod ckpteval_harness {
    use ::std::io::Write;
    static TOKENS: ::std::sync::Mutex<::std::vec::Vec<(::std::string::String, ::std::string::String)>> =
        ::std::sync::Mutex::new(::std::vec::Vec::new());
    static TAKEN: ::std::sync::atomic::AtomicBool = ::std::sync::atomic::AtomicBool::new(false);
    static SAMPLE: ::std::sync::atomic::AtomicUsize = ::std::sync::atomic::AtomicUsize::new(0);
    /// This binary's key, fresh per compile (the checker writes it here and puts it first in
    /// `CKPTEVAL_TOKENS`): a run without it is one the sample's code started itself.
    const KEY: &str = "ckpteval-binary-key";
    /// Before `main`, in every run of this binary (a sample's own code before `main` is
    /// refused): without the key the process ends before libtest runs any test. A sample that
    /// runs the binary again (`/proc/self/exe`, its own index or a neighbour's in
    /// `CKPTEVAL_SAMPLE`) would otherwise read the values the tests expect in their assertion
    /// messages and return them; ending before `main` covers every test, wrapped or not.
    #[used]
    #[link_section = ".init_array"]
    static KEYED: extern "C" fn() = keyed;
    extern "C" fn keyed() {
        let given = unsafe {
            let value = getenv(b"CKPTEVAL_TOKENS\0".as_ptr() as *const ::std::os::raw::c_char);
            if value.is_null() { &[][..] } else { ::std::ffi::CStr::from_ptr(value).to_bytes() }
        };
        if given.split(|b| *b == b';').next() != ::std::option::Option::Some(KEY.as_bytes()) {
            let why = b"ckpteval: this test binary runs under the rust checker only\n";
            unsafe {
                write(2, why.as_ptr(), why.len());
                _exit(99)
            }
        }
    }
    extern "C" {
        fn getenv(name: *const ::std::os::raw::c_char) -> *mut ::std::os::raw::c_char;
        fn prctl(option: ::std::os::raw::c_int, a: ::std::os::raw::c_ulong, b: ::std::os::raw::c_ulong,
                 c: ::std::os::raw::c_ulong, d: ::std::os::raw::c_ulong) -> ::std::os::raw::c_int;
        fn fork() -> ::std::os::raw::c_int;
        fn pipe(fds: *mut ::std::os::raw::c_int) -> ::std::os::raw::c_int;
        fn dup2(from: ::std::os::raw::c_int, to: ::std::os::raw::c_int) -> ::std::os::raw::c_int;
        fn close(fd: ::std::os::raw::c_int) -> ::std::os::raw::c_int;
        fn open(path: *const ::std::os::raw::c_char, flags: ::std::os::raw::c_int, ...) -> ::std::os::raw::c_int;
        fn read(fd: ::std::os::raw::c_int, buf: *mut u8, n: usize) -> isize;
        fn write(fd: ::std::os::raw::c_int, buf: *const u8, n: usize) -> isize;
        fn waitpid(pid: ::std::os::raw::c_int, status: *mut ::std::os::raw::c_int,
                   options: ::std::os::raw::c_int) -> ::std::os::raw::c_int;
        fn _exit(code: ::std::os::raw::c_int) -> !;
        fn syscall(number: ::std::os::raw::c_long, ...) -> ::std::os::raw::c_long;
        fn fcntl(fd: ::std::os::raw::c_int, command: ::std::os::raw::c_int, ...) -> ::std::os::raw::c_int;
        fn poll(fds: *mut PollFd, n: ::std::os::raw::c_ulong, timeout: ::std::os::raw::c_int) -> ::std::os::raw::c_int;
        fn kill(pid: ::std::os::raw::c_int, signal: ::std::os::raw::c_int) -> ::std::os::raw::c_int;
    }
    /// Before the first test body: move the tokens (after the key, `keyed`) out of the
    /// environment (erasing the original environment block too) and make the process
    /// non-dumpable (/proc/self/* become root's).
    fn take() {
        if TAKEN.swap(true, ::std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let raw = unsafe {
            let value = getenv(b"CKPTEVAL_TOKENS\0".as_ptr() as *const ::std::os::raw::c_char);
            if value.is_null() {
                ::std::vec::Vec::new()
            } else {
                let len = ::std::ffi::CStr::from_ptr(value).to_bytes().len();
                let copy = ::std::slice::from_raw_parts(value as *const u8, len).to_vec();
                ::std::ptr::write_bytes(value, 0, len);
                copy
            }
        };
        ::std::env::remove_var("CKPTEVAL_TOKENS");
        if let ::std::result::Result::Ok(index) = ::std::env::var("CKPTEVAL_SAMPLE") {
            SAMPLE.store(index.parse().unwrap_or(::std::primitive::usize::MAX), ::std::sync::atomic::Ordering::SeqCst);
        }
        ::std::env::remove_var("CKPTEVAL_SAMPLE");
        unsafe {
            prctl(4, 0, 0, 0, 0);  // PR_SET_DUMPABLE, 0
        }
        let text = ::std::string::String::from_utf8_lossy(&raw).into_owned();
        let pairs = text.split_once(';').map_or("", |(_key, pairs)| pairs);
        let mut tokens = TOKENS.lock().unwrap_or_else(|e| e.into_inner());
        for pair in pairs.split(';') {
            if let ::std::option::Option::Some((name, token)) = pair.split_once('=') {
                tokens.push((name.into(), token.into()));
            }
        }
    }
    /// Which sample a batch's shared tests call (`CKPTEVAL_SAMPLE`, read with the tokens before
    /// the first test body): the tests of a problem are compiled once for all its samples.
    pub(super) fn sample() -> usize {
        SAMPLE.load(::std::sync::atomic::Ordering::SeqCst)
    }
    fn emit(line: ::std::string::String) {
        let mut out = ::std::io::stdout().lock();
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
    }
    /// Whether a test's return value is a success (a test returns `()` or a `Result`).
    pub(super) trait Outcome {
        fn succeeded(&self) -> bool;
    }
    impl Outcome for () {
        fn succeeded(&self) -> bool {
            true
        }
    }
    impl<T, E> Outcome for ::std::result::Result<T, E> {
        fn succeeded(&self) -> bool {
            self.is_ok()
        }
    }
    fn start(name: &'static str) -> ::std::option::Option<::std::string::String> {
        take();
        let token = {
            let mut tokens = TOKENS.lock().unwrap_or_else(|e| e.into_inner());
            let at = tokens.iter().position(|(n, _)| n == name);
            at.map(|i| tokens.swap_remove(i).1)
        };
        emit(::std::format!("\nckpteval-start {}\n", name));
        token
    }
    fn record(name: &'static str, token: ::std::option::Option<::std::string::String>) {
        if let ::std::option::Option::Some(token) = token {
            emit(::std::format!("\nckpteval-pass {} {}\n", name, token));
        }
    }
    /// Run one test's body; its record is written only on the way out that the test expects:
    /// a normal return with a success, or (`should_panic`) a Rust panic caught here and passed
    /// on to libtest. An unwind that is not a Rust panic (a foreign exception, a forced unwind)
    /// or an exit never comes back here, so it leaves no record.
    pub(super) fn run<R: Outcome>(name: &'static str, should_panic: bool, body: fn() -> R) -> R {
        let token = start(name);
        if !should_panic {
            let result = body();
            if result.succeeded() {
                record(name, token);
            }
            return result;
        }
        match ::std::panic::catch_unwind(body) {
            ::std::result::Result::Ok(result) => result,
            ::std::result::Result::Err(payload) => {
                record(name, token);
                ::std::panic::resume_unwind(payload)
            }
        }
    }
    /// A value that crosses from the sample's process to the tests' as bytes.
    pub(super) trait Wire: ::std::marker::Sized {
        fn put(&self, out: &mut ::std::vec::Vec<u8>);
        fn get(input: &mut &[u8]) -> ::std::option::Option<Self>;
    }
    fn take_bytes<'a>(input: &mut &'a [u8], n: usize) -> ::std::option::Option<&'a [u8]> {
        if input.len() < n {
            return ::std::option::Option::None;
        }
        let (head, rest) = input.split_at(n);
        *input = rest;
        ::std::option::Option::Some(head)
    }
    macro_rules! wire_numbers {
        ($($t:ty),*) => {$(
            impl Wire for $t {
                fn put(&self, out: &mut ::std::vec::Vec<u8>) {
                    out.extend_from_slice(&self.to_le_bytes());
                }
                fn get(input: &mut &[u8]) -> ::std::option::Option<Self> {
                    let bytes = take_bytes(input, ::std::mem::size_of::<$t>())?;
                    ::std::option::Option::Some(<$t>::from_le_bytes(bytes.try_into().ok()?))
                }
            }
        )*};
    }
    wire_numbers!(i8, i16, i32, i64, i128, isize, u8, u16, u32, u64, u128, usize, f32, f64);
    impl Wire for () {
        fn put(&self, _: &mut ::std::vec::Vec<u8>) {}
        fn get(_: &mut &[u8]) -> ::std::option::Option<Self> {
            ::std::option::Option::Some(())
        }
    }
    impl Wire for bool {
        fn put(&self, out: &mut ::std::vec::Vec<u8>) {
            out.push(*self as u8);
        }
        fn get(input: &mut &[u8]) -> ::std::option::Option<Self> {
            ::std::option::Option::Some(take_bytes(input, 1)?[0] != 0)
        }
    }
    impl Wire for char {
        fn put(&self, out: &mut ::std::vec::Vec<u8>) {
            (*self as u32).put(out);
        }
        fn get(input: &mut &[u8]) -> ::std::option::Option<Self> {
            ::std::char::from_u32(u32::get(input)?)
        }
    }
    impl Wire for ::std::string::String {
        fn put(&self, out: &mut ::std::vec::Vec<u8>) {
            self.len().put(out);
            out.extend_from_slice(self.as_bytes());
        }
        fn get(input: &mut &[u8]) -> ::std::option::Option<Self> {
            let n = usize::get(input)?;
            ::std::string::String::from_utf8(take_bytes(input, n)?.to_vec()).ok()
        }
    }
    impl<T: Wire> Wire for ::std::boxed::Box<T> {
        fn put(&self, out: &mut ::std::vec::Vec<u8>) {
            (**self).put(out);
        }
        fn get(input: &mut &[u8]) -> ::std::option::Option<Self> {
            ::std::option::Option::Some(::std::boxed::Box::new(T::get(input)?))
        }
    }
    impl<T: Wire> Wire for ::std::option::Option<T> {
        fn put(&self, out: &mut ::std::vec::Vec<u8>) {
            self.is_some().put(out);
            if let ::std::option::Option::Some(value) = self {
                value.put(out);
            }
        }
        fn get(input: &mut &[u8]) -> ::std::option::Option<Self> {
            ::std::option::Option::Some(if bool::get(input)? { ::std::option::Option::Some(T::get(input)?) } else { ::std::option::Option::None })
        }
    }
    impl<T: Wire, E: Wire> Wire for ::std::result::Result<T, E> {
        fn put(&self, out: &mut ::std::vec::Vec<u8>) {
            self.is_ok().put(out);
            match self {
                ::std::result::Result::Ok(value) => value.put(out),
                ::std::result::Result::Err(error) => error.put(out),
            }
        }
        fn get(input: &mut &[u8]) -> ::std::option::Option<Self> {
            ::std::option::Option::Some(if bool::get(input)? { ::std::result::Result::Ok(T::get(input)?) } else { ::std::result::Result::Err(E::get(input)?) })
        }
    }
    macro_rules! wire_sequences {
        ($($m:ident :: $c:ident [$($bound:tt)*]),*) => {$(
            impl<T: Wire $($bound)*> Wire for ::std::$m::$c<T> {
                fn put(&self, out: &mut ::std::vec::Vec<u8>) {
                    self.len().put(out);
                    for item in self.iter() {
                        item.put(out);
                    }
                }
                fn get(input: &mut &[u8]) -> ::std::option::Option<Self> {
                    let n = usize::get(input)?;
                    let mut items = Self::new();
                    for _ in 0..n {
                        ::std::iter::Extend::extend(&mut items, ::std::iter::once(T::get(input)?));
                    }
                    ::std::option::Option::Some(items)
                }
            }
        )*};
    }
    wire_sequences!(
        vec::Vec [], collections::VecDeque [],
        collections::HashSet [+ ::std::cmp::Eq + ::std::hash::Hash],
        collections::BTreeSet [+ ::std::cmp::Ord]
    );
    macro_rules! wire_maps {
        ($($c:ident [$($bound:tt)*]),*) => {$(
            impl<K: Wire $($bound)*, V: Wire> Wire for ::std::collections::$c<K, V> {
                fn put(&self, out: &mut ::std::vec::Vec<u8>) {
                    self.len().put(out);
                    for (key, value) in self.iter() {
                        key.put(out);
                        value.put(out);
                    }
                }
                fn get(input: &mut &[u8]) -> ::std::option::Option<Self> {
                    let n = usize::get(input)?;
                    let mut items = Self::new();
                    for _ in 0..n {
                        let key = K::get(input)?;
                        items.insert(key, V::get(input)?);
                    }
                    ::std::option::Option::Some(items)
                }
            }
        )*};
    }
    wire_maps!(HashMap [+ ::std::cmp::Eq + ::std::hash::Hash], BTreeMap [+ ::std::cmp::Ord]);
    macro_rules! wire_tuples {
        ($(($($t:ident $i:tt),*)),*) => {$(
            impl<$($t: Wire),*> Wire for ($($t,)*) {
                fn put(&self, out: &mut ::std::vec::Vec<u8>) {
                    $(self.$i.put(out);)*
                }
                fn get(input: &mut &[u8]) -> ::std::option::Option<Self> {
                    ::std::option::Option::Some(($($t::get(input)?,)*))
                }
            }
        )*};
    }
    wire_tuples!((A 0), (A 0, B 1), (A 0, B 1, C 2), (A 0, B 1, C 2, D 3));
    #[repr(C)]
    struct PollFd {
        fd: ::std::os::raw::c_int,
        events: ::std::os::raw::c_short,
        revents: ::std::os::raw::c_short,
    }
    /// `body` run in a child process (see `call`): the bytes it sent back (0 and its value, or
    /// 1 and its panic message) and its wait status. Not generic: compiled once per crate.
    fn in_child(
        body: &mut dyn ::std::ops::FnMut(&mut ::std::vec::Vec<u8>),
    ) -> (::std::vec::Vec<u8>, ::std::os::raw::c_int) {
        let mut fds = [0 as ::std::os::raw::c_int; 2];
        if unsafe { pipe(fds.as_mut_ptr()) } != 0 {
            ::std::panic!("ckpteval: no pipe for the sample's process");
        }
        let pid = unsafe { fork() };
        if pid < 0 {
            ::std::panic!("ckpteval: the sample's process could not start");
        }
        if pid == 0 {
            unsafe {
                let null = open(b"/dev/null\0".as_ptr() as *const ::std::os::raw::c_char, 2);
                dup2(null, 0);
                dup2(2, 1);
                dup2(fds[1], 3);
                fcntl(3, 2, 1); // FD_CLOEXEC: a program the sample starts does not get it
                // close_range(2), number 436 on every Linux architecture (>= 5.9), called by
                // number: glibc < 2.34 has no wrapper; on older kernels, one by one.
                if syscall(436, 4 as ::std::os::raw::c_uint, !0 as ::std::os::raw::c_uint, 0) != 0 {
                    for fd in 4..65536 {
                        close(fd);
                    }
                }
            }
            static PANIC: ::std::sync::Mutex<::std::string::String> =
                ::std::sync::Mutex::new(::std::string::String::new());
            ::std::panic::set_hook(::std::boxed::Box::new(|info| {
                *PANIC.lock().unwrap_or_else(|e| e.into_inner()) = ::std::string::ToString::to_string(info);
            }));
            let mut out = ::std::vec::Vec::new();
            out.push(0);
            match ::std::panic::catch_unwind(::std::panic::AssertUnwindSafe(|| body(&mut out))) {
                ::std::result::Result::Ok(()) => {}
                ::std::result::Result::Err(_) => {
                    out.clear();
                    out.push(1);
                    PANIC.lock().unwrap_or_else(|e| e.into_inner()).put(&mut out);
                }
            }
            let mut framed = (out.len() as u64).to_le_bytes().to_vec();
            framed.extend_from_slice(&out);
            let out = framed;
            let mut at = 0;
            while at < out.len() {
                let n = unsafe { write(3, out[at..].as_ptr(), out.len() - at) };
                if n <= 0 {
                    break;
                }
                at += n as usize;
            }
            unsafe { _exit(0) }
        }
        unsafe {
            close(fds[1]);
        }
        // Read until the framed message is whole, or the child is gone and nothing more came:
        // not until end of file, which a process the child started may hold off for ever.
        let mut bytes = ::std::vec::Vec::new();
        let mut chunk = [0u8; 65536];
        let mut status = 0;
        let mut reaped = false;
        let framed = |bytes: &[u8]| -> ::std::option::Option<usize> {
            let want = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
            (bytes.len() as u64 - 8 >= want).then_some(want as usize)
        };
        while framed(&bytes).is_none() {
            let mut poller = PollFd { fd: fds[0], events: 1, revents: 0 }; // POLLIN
            if unsafe { poll(&mut poller, 1, 50) } > 0 {
                let n = unsafe { read(fds[0], chunk.as_mut_ptr(), chunk.len()) };
                if n <= 0 {
                    break;
                }
                bytes.extend_from_slice(&chunk[..n as usize]);
            } else if reaped {
                break;
            } else if unsafe { waitpid(pid, &mut status, 1) } == pid {
                reaped = true; // WNOHANG: gone; one more round takes what it wrote before
            }
        }
        unsafe {
            close(fds[0]);
            if !reaped {
                kill(pid, 9); // its value is in: nothing of it runs on
                waitpid(pid, &mut status, 0);
            }
        }
        match framed(&bytes) {
            ::std::option::Option::Some(n) => (bytes[8..8 + n].to_vec(), status),
            ::std::option::Option::None => (::std::vec::Vec::new(), status),
        }
    }
    /// Call the sample's function in a child process and return what it returned: the tests,
    /// the harness and the tokens stay in this process, which no code of the sample runs in.
    /// The child can reach nothing of this process's but the pipe its result comes back on
    /// (stdin becomes /dev/null, stdout goes to stderr, which decides no pass but keeps the
    /// output cap; other descriptors are closed before the sample's code runs); a child that
    /// exits, is killed or sends bytes that are no value of `R` makes the test fail here.
    #[track_caller]
    pub(super) fn call<R: Wire, F: ::std::ops::FnOnce() -> R>(f: F) -> R {
        let mut f = ::std::option::Option::Some(f);
        let (bytes, status) = in_child(&mut |out| {
            if let ::std::option::Option::Some(f) = f.take() {
                f().put(out);
            }
        });
        received(&bytes, status)
    }
    /// The value the sample's process sent back, or the panic that says why there is none.
    /// Generic over the return type only (`call`'s own code is compiled once per call of the
    /// entry point in the tests, this once per return type).
    #[track_caller]
    fn received<R: Wire>(bytes: &[u8], status: ::std::os::raw::c_int) -> R {
        let mut input = bytes;
        if let ::std::option::Option::Some([0]) = take_bytes(&mut input, 1) {
            match R::get(&mut input) {
                ::std::option::Option::Some(value) if input.is_empty() => return value,
                _ => ::std::panic!("ckpteval: the sample's process sent no value of its return type"),
            }
        }
        not_returned(bytes, status)
    }
    /// Why the sample's process sent no value: its panic, the signal that killed it, or an exit.
    #[track_caller]
    fn not_returned(bytes: &[u8], status: ::std::os::raw::c_int) -> ! {
        let mut input = bytes;
        match take_bytes(&mut input, 1) {
            ::std::option::Option::Some([1]) => {
                ::std::panic::panic_any(::std::string::String::get(&mut input).unwrap_or_default())
            }
            _ if status & 0x7f != 0 => {
                ::std::panic!("ckpteval: the sample's process was killed by signal {}", status & 0x7f)
            }
            _ => ::std::panic!("ckpteval: the sample's process exited before its function returned"),
        }
    }
}
