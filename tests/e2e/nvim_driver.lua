-- Drives the Neovim plugin (contrib/nvim) for tests/e2e/test_nvim.py: runs
-- its commands as a user would, waits for the replies, and writes what the
-- buffers and the messages showed to a JSON file that the Python side checks
-- against residentd's own answers.
--
--   nvim --headless --clean --cmd 'set rtp^=PLUGIN' -c 'luafile nvim_driver.lua'
-- with RESIDENT_NVIM_TEST naming a JSON file: { "out": path, "steps": [names],
-- "socket": path, ... the steps' inputs }.
local cfg = vim.json.decode(table.concat(vim.fn.readfile(os.getenv('RESIDENT_NVIM_TEST')), '\n'))
local out = { errors = {} }
local TIMEOUT = 30000

local notes = {}
vim.notify = function(msg, level)
  table.insert(notes, { msg = msg, level = level })
end

local resident = require('resident')

local function lines(buf)
  return vim.api.nvim_buf_get_lines(buf, 0, -1, true)
end

local function wait(what, cond)
  if not vim.wait(TIMEOUT, cond, 5) then
    error('timed out waiting for ' .. what)
  end
end

local function finished(buf)
  return function()
    local ok, f = pcall(vim.api.nvim_buf_get_var, buf, 'resident_finish')
    return ok and f ~= ''
  end
end

-- The texts buf went through while a reply streamed in (on_lines).
local function record(buf, on_first)
  local seen = {}
  vim.api.nvim_buf_attach(buf, false, { on_lines = function()
    table.insert(seen, table.concat(lines(buf), '\n'))
    if #seen == 1 and on_first ~= nil then
      vim.schedule(on_first)
    end
  end })
  return seen
end

-- Runs an Ex command and waits for the reply buffer it opens to finish.
local function reply(cmd, on_first)
  vim.cmd(cmd)
  local buf = vim.api.nvim_get_current_buf()
  local seen = record(buf, on_first)
  wait(cmd, finished(buf))
  return {
    name = vim.api.nvim_buf_get_name(buf),
    text = table.concat(lines(buf), '\n'),
    finish = vim.b[buf].resident_finish,
    usage = vim.b[buf].resident_usage,
    seen = seen,
  }
end

local function notes_since(n)
  local r = {}
  for i = n + 1, #notes do
    table.insert(r, notes[i].msg)
  end
  return r
end

local steps = {}

-- The help file's tags: helptags runs on a copy of the plugin (the rtp).
function steps.help()
  local doc = vim.api.nvim_get_runtime_file('doc/resident.txt', false)[1]
  vim.cmd('helptags ' .. vim.fn.fnameescape(vim.fn.fnamemodify(doc, ':h')))
  out.help = {}
  for _, tag in ipairs(cfg.help_tags) do
    out.help[tag] = pcall(vim.cmd, 'help ' .. tag)
    vim.cmd('silent! helpclose')
  end
end

function steps.reply()
  resident.setup({ socket = cfg.socket, max_tokens = cfg.max_tokens, temperature = 0 })
  out.reply = reply('Resident ' .. cfg.prompt)
  vim.cmd('only')
  resident.setup({ socket = cfg.socket, max_tokens = cfg.max_tokens, temperature = 0, raw = true })
  out.raw = reply('Resident ' .. cfg.prompt)
  vim.cmd('only')
end

-- A characterwise selection ending on a multibyte character, then every line.
function steps.selection()
  resident.setup({ socket = cfg.socket, max_tokens = cfg.max_tokens, temperature = 0 })
  vim.cmd('enew')
  local src = vim.api.nvim_get_current_buf()
  vim.api.nvim_buf_set_lines(0, 0, -1, true, cfg.source)
  vim.bo.filetype = 'python'
  vim.cmd('normal! 1G5|vj0f' .. cfg.select_to .. '\27')
  out.selection = reply("'<,'>Resident " .. cfg.sel_prompt)
  vim.cmd('only')
  vim.api.nvim_set_current_buf(src)
  out.whole = reply('%Resident ' .. cfg.sel_prompt)
  vim.cmd('only')
end

-- A long reply, stopped when its first text shows.
function steps.stop()
  resident.setup({ socket = cfg.socket, max_tokens = cfg.long_tokens, temperature = 0 })
  out.stop = reply('Resident ' .. cfg.long_prompt, function()
    vim.cmd('ResidentStop')
  end)
  vim.cmd('only')
  local n = #notes
  vim.cmd('ResidentStop')
  out.stop.idle = notes_since(n)
end

-- Types a turn below the last "## user" of the chat buffer and sends it with <CR>.
local function send(buf, text)
  vim.api.nvim_buf_set_lines(buf, -1, -1, true, vim.split(text, '\n', { plain = true }))
  vim.api.nvim_win_set_cursor(0, { vim.api.nvim_buf_line_count(buf), 0 })
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes('<CR>', true, false, true), 'x', false)
  wait('the chat reply', finished(buf))
end

local function chat_buffer()
  wait('the chat buffer', function()
    return vim.startswith(vim.api.nvim_buf_get_name(0), 'resident://chat/')
  end)
  return vim.api.nvim_get_current_buf()
end

-- The ids of the daemon's sessions.
local function sessions()
  local ids
  resident.conn():request({ op = 'session.list', limit = 1000 }, function(r)
    ids = {}
    for _, s in ipairs(r.sessions or {}) do
      table.insert(ids, s.session)
    end
  end)
  wait('session.list', function()
    return ids ~= nil
  end)
  return ids
end

-- :ResidentChat opened and closed three times without a message.
function steps.unused_chats()
  resident.setup({ socket = cfg.socket, max_tokens = cfg.max_tokens, temperature = 0 })
  local before = sessions()
  local first
  for _ = 1, 3 do
    vim.cmd('ResidentChat')
    local buf = chat_buffer()
    first = first or { name = vim.api.nvim_buf_get_name(buf), lines = lines(buf) }
    vim.cmd('bwipeout! ' .. buf)
  end
  out.unused_chats = { before = before, after = sessions(), first = first }
end

function steps.chat()
  resident.setup({ socket = cfg.socket, max_tokens = cfg.max_tokens, temperature = 0 })
  vim.cmd('ResidentChat')
  local buf = chat_buffer()
  send(buf, cfg.chat1)
  -- a round trip on the same connection: the session's new title is stored
  out.complete = require('resident.chat').complete('')
  out.chat = { session = vim.b[buf].resident_session, lines = lines(buf), name = vim.api.nvim_buf_get_name(buf),
    buffers = vim.tbl_map(vim.api.nvim_buf_get_name, vim.api.nvim_list_bufs()) }
end

function steps.resume()
  resident.setup({ socket = cfg.socket, max_tokens = cfg.max_tokens, temperature = 0 })
  vim.cmd('ResidentChat ' .. cfg.session)
  local buf = chat_buffer()
  out.resumed = { session = vim.b[buf].resident_session, before = lines(buf) }
  send(buf, cfg.chat2)
  out.resumed.after = lines(buf)
  -- :ResidentChat of a session already open goes back to its buffer
  vim.cmd('enew')
  vim.cmd('ResidentChat ' .. cfg.session)
  out.resumed.reopened = vim.api.nvim_get_current_buf() == buf
  -- after :bdelete (the text is gone) it is read from the daemon again
  vim.cmd('bdelete ' .. buf)
  vim.b.resident_session = nil
  vim.cmd('ResidentChat ' .. cfg.session)
  out.resumed.after_bdelete = lines(chat_buffer())
end

-- What the user is told when things go wrong; no empty reply window is left.
function steps.errors()
  out.errors_seen = {}
  local function try(name, opts, cmd)
    resident.setup(vim.tbl_extend('force', { socket = cfg.socket }, opts))
    local n, wins = #notes, #vim.api.nvim_list_wins()
    vim.cmd(cmd)
    wait(name, function()
      return #notes > n
    end)
    out.errors_seen[name] = { notes = notes_since(n), windows_left = #vim.api.nvim_list_wins() - wins }
  end
  try('no_daemon', { socket = cfg.missing_socket }, 'Resident hi')
  try('no_daemon_chat', { socket = cfg.missing_socket }, 'ResidentChat')
  try('unknown_model', { model = 'nosuch' }, 'Resident hi')
  try('unknown_session', {}, 'ResidentChat 00000000-0000-0000-0000-000000000000')
  try('no_prompt', {}, 'Resident')
end

-- A daemon of another protocol version, whose frames come a byte at a time.
function steps.version()
  resident.setup({ socket = cfg.fake_socket })
  local n = #notes
  vim.cmd('ResidentChat')
  wait('the refusal', function()
    return #notes > n
  end)
  out.version = notes_since(n)
end

for _, name in ipairs(cfg.steps) do
  local ok, err = pcall(steps[name])
  if not ok then
    table.insert(out.errors, name .. ': ' .. tostring(err))
  end
end
out.notes = notes
vim.fn.writefile({ vim.json.encode(out) }, cfg.out)
vim.cmd('qa!')
