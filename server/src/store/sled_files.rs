//! The files of a sled store: opening them, fsyncing them, copying a store.
//!
//! A store directory `<dir>` holds the sled database in `<dir>/db`. sled
//! 0.34.7 treats that path as a directory holding `db` (the log: every record
//! lives in its segments), `conf` (written once, fsynced by sled), `blobs/`
//! (large messages, written without fsync) and `snap.*` files (snapshots
//! sled can rebuild from the log). With 8 MiB segments a message goes to a
//! blob only above ~2 MiB; values are capped at 64 KiB and leaf pages split
//! beyond 16 items, so no record reaches a blob and fsyncing the `db` file is
//! enough for durability.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

/// sled's segment size: large enough that no record goes to a blob file.
const SEGMENT_SIZE: usize = 8 * 1024 * 1024;

/// The cache of a store opened only to be written once (a backup).
const BACKUP_CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// Records per `apply_batch` while copying a store.
const COPY_CHUNK: usize = 10_000;

/// An open sled database and a handle on its log file, for fsync.
pub(crate) struct OpenedDb {
    pub(crate) db: sled::Db,
    pub(crate) log_file: File,
    /// Marks the database open in this process until this is dropped.
    pub(crate) open_here: OpenHere,
}

/// The sled directories this process has open: a second open of one of
/// them fails as soon as another process's would, while one closed a
/// moment ago (whose lock sled releases from a background thread) is
/// waited for.
static OPEN_HERE: std::sync::Mutex<std::collections::BTreeSet<PathBuf>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// One entry of [`OPEN_HERE`], removed when dropped.
pub(crate) struct OpenHere(PathBuf);

impl OpenHere {
    fn register(sled_dir: &Path) -> Self {
        let mut open = OPEN_HERE.lock().unwrap_or_else(|e| e.into_inner());
        open.insert(sled_dir.to_path_buf());
        Self(sled_dir.to_path_buf())
    }

    fn contains(sled_dir: &Path) -> bool {
        let open = OPEN_HERE.lock().unwrap_or_else(|e| e.into_inner());
        open.contains(sled_dir)
    }
}

impl Drop for OpenHere {
    fn drop(&mut self) {
        let mut open = OPEN_HERE.lock().unwrap_or_else(|e| e.into_inner());
        open.remove(&self.0);
    }
}

/// The sled directory of the store directory `dir`.
pub(crate) fn sled_dir(dir: &Path) -> PathBuf {
    dir.join("db")
}

/// Opens (or creates) the store in `dir` and makes its directory entries
/// durable. With `create_new`, fails if a database is already there.
pub(crate) fn open_db(
    dir: &Path,
    cache_capacity_bytes: u64,
    create_new: bool,
) -> Result<OpenedDb, String> {
    let sled_dir = sled_dir(dir);
    refuse_another_users_directory(dir)?;
    fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let config = sled::Config::new()
        .path(&sled_dir)
        .segment_size(SEGMENT_SIZE)
        .cache_capacity(cache_capacity_bytes)
        .create_new(create_new);
    let log_path = sled_dir.join("db");
    let db =
        open_waiting_for_lock(&config, &sled_dir, &log_path).map_err(|error| match &error {
            sled::Error::Io(io) if is_lock_held(io) => in_use(dir, &log_path),
            _ => format!("opening sled: {error}"),
        })?;
    let open_here = OpenHere::register(&sled_dir);
    // Write access is not used, but some platforms require it to fsync.
    let log_file = OpenOptions::new()
        .write(true)
        .open(&log_path)
        .map_err(|e| format!("opening {} for fsync: {e}", log_path.display()))?;
    // The new files' directory entries must survive a power loss too; cheap
    // enough to repeat on every open, which also covers a crash right after
    // creation.
    for directory in [sled_dir.join("blobs"), sled_dir.clone(), dir.to_path_buf()] {
        sync_dir(&directory)
            .map_err(|e| format!("fsyncing directory {}: {e}", directory.display()))?;
    }
    make_private(dir)?;
    Ok(OpenedDb {
        db,
        log_file,
        open_here,
    })
}

/// Refuses a store directory that belongs to another user than the one
/// this process runs as: whatever the process wrote there (a backup, sled's
/// files, the admin token) would belong to it, and the directory's owner,
/// the server, could not open them. Root running `reconciled migrate` or
/// `repair` on the service's directory would break the service at its
/// next start or migration, long after the command said it succeeded. A
/// directory that does not exist yet is created by this process, so it is
/// its own.
fn refuse_another_users_directory(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(metadata) = fs::metadata(dir) else {
        return Ok(());
    };
    let owner = metadata.uid();
    let this = nix::unistd::geteuid().as_raw();
    if owner == this {
        return Ok(());
    }
    Err(format!(
        "{} belongs to uid {owner} and this process runs as uid {this}: what it wrote there \
         would belong to the wrong user; run reconciled as the directory's owner (e.g. \
         `setpriv --reuid {owner} --regid {gid} --clear-groups reconciled ...`, with the \
         server stopped)",
        dir.display(),
        gid = metadata.gid()
    ))
}

/// How long opening waits for sled's file lock held by another process:
/// that one is using the store, so opening fails soon with a clear error.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long opening waits for sled's file lock held by this process for a
/// store it closed: a store dropped a moment ago releases it only once
/// sled's background I/O threads let go of the database (a restart
/// in-process, a migration reopening, a backup opened right after it was
/// written), which on a loaded machine took over 10 s.
const OWN_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Opens `config`, retrying while its file lock on `db_file` is held: up
/// to [`LOCK_WAIT`] when another process holds it or this process still
/// has the store open, or [`OWN_LOCK_WAIT`] otherwise (this process closed
/// it a moment ago, or it was released between the attempt and the look
/// at `/proc/locks`).
fn open_waiting_for_lock(
    config: &sled::Config,
    sled_dir: &Path,
    db_file: &Path,
) -> sled::Result<sled::Db> {
    let started = std::time::Instant::now();
    loop {
        match config.open() {
            Err(sled::Error::Io(error))
                if is_lock_held(&error)
                    && (started.elapsed() < LOCK_WAIT
                        || (started.elapsed() < OWN_LOCK_WAIT
                            && !OpenHere::contains(sled_dir)
                            && !locked_by_another_process(db_file))) =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            opened => return opened,
        }
    }
}

/// Whether `error` says the database's file lock is held. sled 0.34
/// reports it as an `Other` I/O error whose text names the lock (the
/// system call's `WouldBlock` appears only inside that text).
fn is_lock_held(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::WouldBlock
        || error.to_string().starts_with("could not acquire lock")
}

/// Why the store in `dir` cannot be opened while another process holds its
/// lock on `db_file`: naming the process, when `/proc/locks` shows it, and
/// what to do (sled's own text is an `Os { code: 11, kind: WouldBlock }`).
fn in_use(dir: &Path, db_file: &Path) -> String {
    let holder = match lock_holder(db_file) {
        Some(pid) => format!("process {pid}"),
        None => String::from("another process (or this one)"),
    };
    format!(
        "its data directory is in use by {holder} (only one reconciled, whether server, migrate, \
         repair or store copy, may use {} at a time): stop that process first, or point \
         --data-dir at another directory",
        dir.display()
    )
}

/// Whether `/proc/locks` shows a lock on `file` held by a process other
/// than this one (`false` where that cannot be read).
fn locked_by_another_process(file: &Path) -> bool {
    lock_holder(file).is_some()
}

/// The id of a process other than this one that `/proc/locks` shows
/// holding a lock on `file` (`None` where that cannot be read).
fn lock_holder(file: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt as _;
    let metadata = fs::metadata(file).ok()?;
    let locks = fs::read_to_string("/proc/locks").ok()?;
    let pid = std::process::id();
    let inode = metadata.ino().to_string();
    // "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let holder = fields.get(4)?.parse::<u32>().ok()?;
        (holder != pid && fields.get(5)?.rsplit(':').next() == Some(inode.as_str()))
            .then_some(holder)
    })
}

/// Mode of every directory of a store: only the server's user may list or
/// enter it.
pub(crate) const PRIVATE_DIR_MODE: u32 = 0o700;

/// Mode of every file of a store: only the server's user may read or write.
pub(crate) const PRIVATE_FILE_MODE: u32 = 0o600;

/// Makes `dir` and everything under it private to the server's user
/// (directories 0700, files 0600), whatever the umask or an earlier version
/// left: the store holds every tenant's items and token hashes. Symbolic
/// links below `dir` are left alone (and not followed); `dir` itself may be
/// one (systemd's `DynamicUser=` makes the state directory a link into
/// `/var/lib/private`, and operators link a data directory onto another
/// disk): the directory it points to is made private.
pub(crate) fn make_private(dir: &Path) -> Result<(), String> {
    let dir = fs::canonicalize(dir)
        .map_err(|e| format!("resolving the data directory {}: {e}", dir.display()))?;
    let mut pending = vec![dir];
    while let Some(path) = pending.pop() {
        let metadata = fs::symlink_metadata(&path)
            .map_err(|e| format!("reading the mode of {}: {e}", path.display()))?;
        let mode = if metadata.is_dir() {
            let entries =
                fs::read_dir(&path).map_err(|e| format!("listing {}: {e}", path.display()))?;
            for entry in entries {
                pending.push(
                    entry
                        .map_err(|e| format!("listing {}: {e}", path.display()))?
                        .path(),
                );
            }
            PRIVATE_DIR_MODE
        } else if metadata.is_file() {
            PRIVATE_FILE_MODE
        } else {
            continue;
        };
        if metadata.permissions().mode() & 0o777 != mode {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).map_err(|e| {
                format!(
                    "making {} private (mode {mode:o}): {e}; run the server as the \
                     directory's owner, or give it a data directory it creates itself (one \
                     below a volume's root, which belongs to root)",
                    path.display()
                )
            })?;
        }
    }
    Ok(())
}

/// The name a store being written by [`write_new_store`] has until it is
/// complete: `<dir>.incomplete`.
pub(crate) fn incomplete_path(dir: &Path) -> Result<PathBuf, String> {
    let name = dir
        .file_name()
        .ok_or_else(|| format!("{} names no directory", dir.display()))?;
    let mut name = name.to_os_string();
    name.push(".incomplete");
    Ok(dir.with_file_name(name))
}

/// Creates a new store in `dir` holding `records`, durably. `dir` must not
/// exist. Used for backups: the result opens with `SledStore::open(dir, ..)`.
///
/// The store is written as `<dir>.incomplete` and renamed to `dir` only
/// once every record is in it and fsynced, so a process killed while
/// copying never leaves a partial copy under the name of a backup (an
/// operator restoring it would lose records). A `<dir>.incomplete` left by
/// such a process is removed first.
pub(crate) fn write_new_store<I>(dir: &Path, records: I) -> Result<(), String>
where
    I: IntoIterator<Item = Result<(Vec<u8>, Vec<u8>), String>>,
{
    if dir.exists() {
        return Err("the path already exists".to_owned());
    }
    let partial = incomplete_path(dir)?;
    if partial.exists() {
        fs::remove_dir_all(&partial).map_err(|e| {
            format!(
                "removing {}, left by a copy that did not finish: {e}",
                partial.display()
            )
        })?;
    }
    let target = open_db(&partial, BACKUP_CACHE_BYTES, true)?;
    let mut chunk = sled::Batch::default();
    let mut chunk_len = 0;
    for record in records {
        let (key, value) = record?;
        chunk.insert(key, value);
        chunk_len += 1;
        if chunk_len == COPY_CHUNK {
            target
                .db
                .apply_batch(std::mem::take(&mut chunk))
                .map_err(|e| format!("writing the copy: {e}"))?;
            super::sled_garbage::collect_after(chunk_len);
            chunk_len = 0;
        }
    }
    target
        .db
        .apply_batch(chunk)
        .map_err(|e| format!("writing the copy: {e}"))?;
    target
        .db
        .flush()
        .map_err(|e| format!("flushing the copy: {e}"))?;
    target
        .log_file
        .sync_all()
        .map_err(|e| format!("fsyncing the copy: {e}"))?;
    drop(target);
    fs::rename(&partial, dir).map_err(|e| {
        format!(
            "renaming the complete copy {} to {}: {e}",
            partial.display(),
            dir.display()
        )
    })?;
    // The rename must survive a power loss too.
    if let Some(parent) = dir.parent() {
        sync_dir(parent).map_err(|e| format!("fsyncing directory {}: {e}", parent.display()))?;
    }
    Ok(())
}

fn sync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_store_s_lock_is_not_taken_for_another_process_s() {
        let root = tempfile::tempdir().expect("tempdir");
        let opened = open_db(root.path(), 1 << 20, true).expect("opens");
        let db_file = sled_dir(root.path()).join("db");
        let locks = fs::read_to_string("/proc/locks").expect("/proc/locks");
        let pid = std::process::id().to_string();
        assert!(
            locks
                .lines()
                .any(|line| line.split_whitespace().nth(4) == Some(pid.as_str())),
            "this process holds a lock: {locks}"
        );
        assert!(!locked_by_another_process(&db_file));
        drop(opened);
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).expect("stat").permissions().mode() & 0o777
    }

    #[test]
    fn a_store_is_private_whatever_the_modes_before() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("data");
        fs::create_dir_all(dir.join("nested")).expect("mkdir");
        fs::write(dir.join("nested").join("loose"), b"x").expect("write");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
        fs::set_permissions(dir.join("nested/loose"), fs::Permissions::from_mode(0o644))
            .expect("chmod");
        drop(open_db(&dir, BACKUP_CACHE_BYTES, false).expect("opens"));
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("nested")), 0o700);
        assert_eq!(mode(&dir.join("nested/loose")), 0o600);
        assert_eq!(mode(&sled_dir(&dir)), 0o700);
        assert_eq!(mode(&sled_dir(&dir).join("db")), 0o600);
        assert_eq!(mode(&sled_dir(&dir).join("conf")), 0o600);
    }
}
