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
    fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let db = sled::Config::new()
        .path(&sled_dir)
        .segment_size(SEGMENT_SIZE)
        .cache_capacity(cache_capacity_bytes)
        .create_new(create_new)
        .open()
        .map_err(|e| format!("opening sled: {e}"))?;
    let log_path = sled_dir.join("db");
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
    Ok(OpenedDb { db, log_file })
}

/// Creates a new store in `dir` holding `records`, durably. `dir` must not
/// exist. Used for backups: the result opens with `SledStore::open(dir, ..)`.
pub(crate) fn write_new_store<I>(dir: &Path, records: I) -> Result<(), String>
where
    I: IntoIterator<Item = Result<(Vec<u8>, Vec<u8>), String>>,
{
    if dir.exists() {
        return Err("the path already exists".to_owned());
    }
    let target = open_db(dir, BACKUP_CACHE_BYTES, true)?;
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
    Ok(())
}

fn sync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}
